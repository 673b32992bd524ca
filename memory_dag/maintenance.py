"""Nightly maintenance of the memory store (issue 5): one function per scheduled job.

Every job takes the settings and `now`, the job's clock (schedules pass their scheduled time,
tests move it forward), and returns a `StageReport` whose counts always hold `examined`,
`merged`, `decayed`, `soft_deleted`, `purged` and `created`, plus the job's own counts. Each
job works without an LLM and uses one when `Settings.llm_configured`. No connection is held
during an LLM call: a job reads, thinks, then writes in one short transaction. Every change is
recorded through `memory_ops.MemoryWriter` (`history`, and a `change_log` row per transition).
A job that changed what the search index holds republishes it before returning, so a
soft-deleted memory leaves the vector index in the same run.

Jobs (seed 004, seed 003 §3, §4, §7, §12, seed 000 §4.5):

* `entity_enrichment`: memories (facts, episodes) with at most 2 entity links and no
  `attributes.enriched_at` are linked again, at most 50 a night, and stamped. Skipped, and
  said so, when no accurate extractor (spaCy + en_core_web_sm) is installed.
* `consolidate_pending`: `write_path.consolidate(include_open=True)`, the code the session
  sensor runs, so every pending session is consolidated.
* `dedup_merge`: candidates (facts changed in 72 h, importance >= 3, or in the top decile by
  access count) are paired with facts of the same scope (user, else conversation). A pair is
  kept when its cosine is >= 0.75, its newer member changed in the last 90 days, and the texts
  share content words (Jaccard >= 0.3) or differ by a number ("2 kids" / "3 kids"). Pairs
  judged in the last 14 days (`merge_fingerprints`) are skipped; a scope gets one pass a day
  with at most 50 pairs, judged by the LLM in batches of 8 or by `reconcile.relate` (duplicate
  or update -> same fact). A merge keeps the newer fact with the union of both provenances.
* `decay`: `confidence × exp(−decay_rate × days)` since the later of the last access (or
  creation) and the last decay, counted to the start of `now`'s day; below 0.05 the memory is
  soft-deleted (purge in 30 days) and its entity links removed. `decay_rate = 0` never decays.
* `lifecycle`: purge of what was due (`purge_at`) before the day began; TTL (not accessed since
  60 days before the day began, importance < 3, not pinned, decay_rate > 0) -> soft-deleted
  with `purge_at` = +30 days; eviction of the oldest facts and turns of a conversation above
  500 active memories (summaries and pinned memories exempt).
* `reflection`: per scope, at most once per 6 days and only with >= 3 facts in the last 7 days,
  a `reflection` memory tagged `weekly` with `decay_rate` 0: the LLM's, else the week's 5 most
  important facts (extractive).
* `insights`: per scope with new facts in the last 24 h and no insights run in the last 24 h,
  1-3 third-person insights of at most 280 characters, kind `insight`, category
  `relationship_dynamic`, importance 2. Needs an LLM: without one the job is skipped, and says
  why (rules cannot read trust or emotion from facts honestly).

`remember_procedure` stores a procedural memory (seed 003 §12): numbered steps, category
`procedural`, which default retrieval leaves out.

Decisions:

* Time-based rules move once a day (decay, TTL and purge count to the start of `now`'s day),
  so a second run on the same day finds nothing more to do. Decay is idempotent by
  construction: each memory carries `attributes.decayed_at`, the day boundary its confidence
  was last decayed to, and a run decays only the time since then (or since a later access).
  Decaying in one step or in many gives the same confidence.
* Confidence-only decay leaves one job-level `DECAY` history row (memory_id NULL) with the
  counts and the day, not one row per memory per night; each memory's `decayed_at` says when
  it was decayed. Every state transition (decay, TTL or eviction soft delete, merge, purge,
  new memory) has its own history row and one change-log row.
* Soft deletes by these jobs set `valid_until` and `purge_at` from the job's clock (the
  writer's own `soft_delete` stamps the wall clock) and remove the memory's entity links (the
  entities' mention counts follow). Merged-away facts get `replaced_by` and no purge date: they
  are the survivor's provenance.
* Scopes: a memory belongs to its user when it has one, else to its conversation. The dedup
  cap, reflections and insights are per scope; pairs never cross scopes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from memory_dag import pipeline
from memory_dag.config import Settings
from memory_dag.embeddings import get_provider
from memory_dag.entities import accurate_extractor_available
from memory_dag.llm import LLMClient, LLMConfig, LLMError
from memory_dag.memory_ops import MemoryWriter, NewMemory
from memory_dag.pipeline import StageReport
from memory_dag.prompts import MAX_FACT_CHARS
from memory_dag.reconcile import relate, tokens
from memory_dag.store import fetch_arrow, fetch_dicts, open_store

ACTOR = "maintenance"
#: Every report holds these counts (0 when a job does not do that kind of change).
REPORT_COUNTS = ("examined", "merged", "decayed", "soft_deleted", "purged", "created")
REFLECTION_TAG = "weekly"
INSIGHT_CATEGORY = "relationship_dynamic"
PROCEDURAL_CATEGORY = "procedural"
MAX_REFLECTION_CHARS = 1000
MAX_PROCEDURE_CHARS = 2000
PREVIEW_ROWS = 10

_SCOPE_SQL = (
    "CASE WHEN user_id IS NOT NULL THEN 'user:' || user_id "
    "ELSE 'conversation:' || coalesce(conversation_id, '') END"
)
_ACTIVE_SQL = "valid_until IS NULL AND state = 'active'"


@dataclass(frozen=True)
class MaintenanceConfig:
    """Thresholds of the jobs; the defaults are the seeds' numbers."""

    # entity enrichment (seed 004)
    enrichment_limit: int = 50
    enrichment_max_entities: int = 2
    # dedup / merge (seed 003 §4)
    dedup_changed_hours: float = 72
    dedup_importance_min: int = 3
    dedup_access_quantile: float = 0.9
    dedup_cosine_min: float = 0.75
    dedup_recency_days: float = 90
    dedup_min_overlap: float = 0.3
    dedup_batch_pairs: int = 8
    dedup_pairs_per_scope_per_day: int = 50
    fingerprint_days: float = 14
    # decay (seed 004)
    decay_threshold: float = 0.05
    # lifecycle (seed 003 §7, seed 000 §4.5)
    ttl_days: float = 60
    ttl_importance_below: int = 3
    purge_after_days: float = 30
    max_entries: int = 500
    # reflection (seed 004)
    reflection_min_days: float = 6
    reflection_window_days: float = 7
    reflection_min_facts: int = 3
    reflection_max_inputs: int = 200
    # insights (seed 003 §3)
    insights_cooldown_hours: float = 24
    insights_max_tokens: int = 220


DEFAULT_CONFIG = MaintenanceConfig()


# --------------------------------------------------------------------------- shared helpers


def _report(job: str) -> StageReport:
    return StageReport(job, counts=dict.fromkeys(REPORT_COUNTS, 0))


@contextmanager
def _timed(report: StageReport) -> Iterator[StageReport]:
    started = time.perf_counter()
    try:
        yield report
    finally:
        report.seconds = round(time.perf_counter() - started, 3)


@contextmanager
def _writer(settings: Settings) -> Iterator[MemoryWriter]:
    """A short connection with one writer transaction (all or nothing)."""
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=ACTOR)
        with writer.transaction():
            yield writer


def _llm(settings: Settings) -> LLMClient | None:
    config = LLMConfig.from_settings(settings)
    return LLMClient(config) if config is not None else None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def day_start(now: datetime) -> datetime:
    """Midnight of `now`'s day, in `now`'s timezone: the unit of 'the same day'."""
    now = _aware(now)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def scope_owner(scope: str) -> tuple[str | None, str | None]:
    """(user_id, conversation_id) of a scope key from `_SCOPE_SQL`."""
    kind, _, value = scope.partition(":")
    if kind == "user":
        return value, None
    return None, value or None


def _refresh_index(settings: Settings, report: StageReport) -> None:
    """Embed what is missing and republish the index, so the change is searchable (or gone)."""
    index = pipeline.refresh_search_index(settings)[-1]
    report.counts["index_rows"] = int(index.counts.get("rows", 0))
    report.notes.append("search index republished" if not index.skipped else "index unchanged")


def _unlink_entities(con: Any, memory_ids: list[str]) -> int:
    """Remove the memories' entity links; the entities' mention counts follow."""
    if not memory_ids:
        return 0
    con.execute(
        "UPDATE entities SET mention_count = entities.mention_count - gone.n "
        "FROM (SELECT entity_id, count(*) AS n FROM memory_entities "
        "      WHERE memory_id IN (SELECT unnest(?::TEXT[])) GROUP BY entity_id) gone "
        "WHERE entities.id = gone.entity_id",
        [memory_ids],
    )
    row = con.execute(
        "DELETE FROM memory_entities WHERE memory_id IN (SELECT unnest(?::TEXT[]))", [memory_ids]
    ).fetchone()
    return int(row[0]) if row else 0


def _soft_delete(
    writer: MemoryWriter,
    rows: list[dict[str, Any]],
    *,
    event: str,
    now: datetime,
    purge_days: float | None,
    meta: Callable[[dict[str, Any]], dict[str, Any]],
    change: str | None = "soft_deleted",
) -> None:
    """Soft-delete `rows` (dicts with id, content, conversation_id, and optionally
    replaced_by) at the job's clock, in bulk.

    The entity links go (their ids are kept in the history meta); one history row per memory,
    and one change-log row per memory unless `change` is None (a merge logs the survivor).
    """
    if not rows:
        return
    ids = [row["id"] for row in rows]
    links = dict(
        writer.con.execute(
            "SELECT memory_id, list(entity_id ORDER BY entity_id) FROM memory_entities "
            "WHERE memory_id IN (SELECT unnest(?::TEXT[])) GROUP BY memory_id",
            [ids],
        ).fetchall()
    )
    purge_at = now + timedelta(days=purge_days) if purge_days is not None else None
    gone = pa.table(
        {"id": ids, "replaced_by": pa.array([r.get("replaced_by") for r in rows], pa.string())}
    )
    writer.con.register("_gone", gone)
    try:
        writer.con.execute(
            "UPDATE memories SET valid_until = ?, state = 'soft_deleted', purge_at = ?, "
            "replaced_by = coalesce(g.replaced_by, memories.replaced_by) "
            "FROM _gone g WHERE memories.id = g.id",
            [now, purge_at],
        )
    finally:
        writer.con.unregister("_gone")
    _unlink_entities(writer.con, ids)
    for row in rows:
        details = {"text": row["content"], "entity_ids": links.get(row["id"], []), **meta(row)}
        if purge_at is not None:
            details["purge_at"] = purge_at.isoformat()
        writer.history(
            row["id"], event, old_ref=row["id"], new_ref=row.get("replaced_by"), meta=details
        )
        if change is not None:
            writer.log_change(row["conversation_id"], row["id"], change, {"job": event.lower()})


# --------------------------------------------------------------------------- entity enrichment


def entity_enrichment(
    settings: Settings,
    now: datetime,
    *,
    config: MaintenanceConfig = DEFAULT_CONFIG,
    accurate_available: Callable[[], bool] = accurate_extractor_available,
) -> StageReport:
    """Re-link entities of sparsely linked memories with the accurate extractor (seed 004).

    `accurate_available` says whether the accurate extractor is installed (spaCy + model).
    """
    report = _report("entity_enrichment")
    with _timed(report):
        if not accurate_available():
            report.skipped = True
            report.notes.append(
                "skipped: no accurate extractor installed (spaCy with en_core_web_sm); "
                "the fast extractor already linked these memories"
            )
            return report
        with _writer(settings) as writer:
            pending = writer.con.execute(
                """
                SELECT m.id, m.content FROM memories m
                WHERE m.valid_until IS NULL AND m.state = 'active'
                  AND m.kind IN ('fact', 'episode')
                  AND json_extract_string(m.attributes, '$.enriched_at') IS NULL
                  AND (SELECT count(*) FROM memory_entities l WHERE l.memory_id = m.id) <= ?
                ORDER BY m.created_at DESC, m.id LIMIT ?
                """,
                [config.enrichment_max_entities, config.enrichment_limit],
            ).fetchall()
            ids = [row[0] for row in pending]
            writer.link_entities([(row[0], row[1]) for row in pending])
            writer.con.execute(
                "UPDATE memories SET attributes = json_merge_patch(coalesce(attributes, "
                "'{}'::JSON), json_object('enriched_at', ?::VARCHAR)) "
                "WHERE id IN (SELECT unnest(?::TEXT[]))",
                [_aware(now).isoformat(), ids],
            )
        report.counts["examined"] = len(ids)
        report.counts["entity_links"] = writer.counts.get("entity_links", 0)
        report.counts["entities_created"] = writer.counts.get("entities_created", 0)
    return report


# --------------------------------------------------------------------------- consolidation


def consolidate_pending(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Consolidate every pending session, the open ones too, with the session sensor's code.

    `now` is not used: the write path stamps its own times. The index is republished when
    facts changed.
    """
    from memory_dag import write_path

    report = _report("session_consolidation")
    with _timed(report):
        written = write_path.consolidate(settings, include_open=True)
        counts = written.counts
        report.counts.update(counts)
        report.counts["examined"] = counts.get("turns_examined", 0)
        report.counts["created"] = counts.get("facts_added", 0) + counts.get("facts_updated", 0)
        report.counts["soft_deleted"] = counts.get("facts_deleted", 0) + counts.get(
            "facts_updated", 0
        )
        report.notes.extend(written.notes)
        report.preview = written.preview
        if report.counts["created"] or report.counts["soft_deleted"]:
            _refresh_index(settings, report)
    return report


# --------------------------------------------------------------------------- dedup / merge

_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
#: Words that say nothing about what a fact is about ("user" is in every fact about the user).
_STOPWORDS = frozenset(
    {"a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "for", "with", "by"}
    | {"from", "as", "is", "are", "was", "were", "be", "been", "has", "have", "had", "do"}
    | {"does", "did", "not", "no", "user", "user's", "their", "there", "this", "that", "it"}
    | {"its", "into", "about", "than", "then", "so", "very", "also"}
)


def content_words(text: str) -> set[str]:
    return {word for word in tokens(text) if word not in _STOPWORDS and not word.isdigit()}


def numeric_step(a: str, b: str) -> bool:
    """The two texts say the same thing with different numbers ("2 kids" / "3 kids")."""
    numbers_a, numbers_b = _NUMBER.findall(a), _NUMBER.findall(b)
    if not numbers_a or not numbers_b or numbers_a == numbers_b:
        return False
    return _NUMBER.sub("#", a.lower()).split() == _NUMBER.sub("#", b.lower()).split()


def lexical_overlap(a: str, b: str) -> float:
    """Jaccard of the content words (stopwords and 'user' left out)."""
    words_a, words_b = content_words(a), content_words(b)
    if not words_a or not words_b:
        return 0.0
    return len(words_a & words_b) / len(words_a | words_b)


@dataclass
class FactRow:
    id: str
    content: str
    scope: str
    conversation_id: str | None
    created_at: datetime
    changed_at: datetime
    importance: int
    pinned: bool
    access_count: int
    last_accessed: datetime | None
    confidence: float
    decay_rate: float
    source_ids: list[str]
    tags: list[str]


@dataclass
class Pair:
    older: FactRow
    newer: FactRow
    score: float
    why: str

    @property
    def fingerprint(self) -> str:
        """Seed 003 §4: (id_a, id_b, round(score, 2)), prefixed by the scope for the daily cap."""
        first, second = sorted((self.older.id, self.newer.id))
        return f"{self.newer.scope}|{first}|{second}|{self.score:.2f}"


@dataclass
class Verdict:
    same: bool
    reason: str
    text: str | None = None


class PairAnswer(BaseModel):
    """One pair in the LLM's answer."""

    pair: int
    same: bool
    text: str | None = None


MERGE_PROMPT = """\
You check a long-term memory for duplicates. For each numbered pair of memories decide whether \
A and B state the same fact: the same information in other words, or a newer value of the same \
fact (B is newer than A, for example an age or a count that changed).

For each pair that is the same fact, write the merged memory: one self-contained, third-person \
statement with no pronouns, at most 280 characters, keeping B's value where they differ.

Pairs (JSON):
{pairs}

Answer with a JSON list and nothing else, one element per pair:
{{"pair": <number>, "same": true | false, "text": "<merged memory, only when same>"}}
"""


def _changed_times(con: Any, since: datetime) -> dict[str, datetime]:
    """When each memory last changed, not counting this job's own merges (a merge must not
    pull its survivor into tomorrow's pool, or a second run the same day into more work)."""
    rows = con.execute(
        "SELECT memory_id, max(ts) FROM history WHERE ts >= ? AND memory_id IS NOT NULL "
        "AND actor <> ? GROUP BY memory_id",
        [since, ACTOR],
    ).fetchall()
    return {row[0]: row[1] for row in rows}


def _load_facts(con: Any, provider_name: str, model: str) -> tuple[list[FactRow], np.ndarray, int]:
    """Active facts with their cached vectors (rows without one are zero; see `_fill_vectors`)."""
    table = fetch_arrow(
        con,
        f"""
        SELECT m.id, m.content, {_SCOPE_SQL} AS scope, m.conversation_id, m.created_at,
               m.importance, m.pinned, m.access_count, m.last_accessed, m.confidence,
               m.decay_rate, m.source_ids, m.tags, e.embedding
        FROM facts m LEFT JOIN embedding_cache e
          ON e.provider = ? AND e.model = ? AND e.hash = sha256(m.content)
        ORDER BY m.created_at, m.id
        """,
        [provider_name, model],
    )
    rows = [
        FactRow(
            id=r["id"],
            content=r["content"],
            scope=r["scope"],
            conversation_id=r["conversation_id"],
            created_at=r["created_at"],
            changed_at=r["created_at"],
            importance=int(r["importance"]),
            pinned=bool(r["pinned"]),
            access_count=int(r["access_count"]),
            last_accessed=r["last_accessed"],
            confidence=float(r["confidence"]),
            decay_rate=float(r["decay_rate"]),
            source_ids=list(r["source_ids"] or []),
            tags=list(r["tags"] or []),
        )
        for r in table.drop_columns(["embedding"]).to_pylist()
    ]
    column = table.column("embedding").combine_chunks()
    present = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    dims = values.size // int(present.sum()) if present.any() else 0
    vectors = np.zeros((len(rows), dims), dtype=np.float32)
    if dims:
        vectors[present] = values.reshape(-1, dims)
    return rows, vectors, int((~present).sum())


def _fill_vectors(settings: Settings, rows: list[FactRow], vectors: np.ndarray) -> np.ndarray:
    """Embed the facts the cache does not hold yet (no connection is open meanwhile)."""
    missing = [i for i in range(len(rows)) if not vectors.shape[1] or not vectors[i].any()]
    if not missing:
        return vectors
    embedded = get_provider(settings).embed([rows[i].content for i in missing])
    if vectors.shape[1] != embedded.shape[1]:
        vectors = np.zeros((len(rows), embedded.shape[1]), dtype=np.float32)
        missing = list(range(len(rows)))
        embedded = get_provider(settings).embed([row.content for row in rows])
    vectors[missing] = embedded
    return vectors


def _normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def candidate_pool(rows: list[FactRow], now: datetime, config: MaintenanceConfig) -> list[int]:
    """Seed 003 §4: changed in the last 72 h, or important, or often retrieved (top decile)."""
    if not rows:
        return []
    recent = now - timedelta(hours=config.dedup_changed_hours)
    counts = np.array([row.access_count for row in rows])
    frequent = float(np.quantile(counts, config.dedup_access_quantile))
    return [
        i
        for i, row in enumerate(rows)
        if row.changed_at >= recent
        or row.importance >= config.dedup_importance_min
        or (row.access_count > 0 and row.access_count >= frequent)
    ]


#: Partners looked at per candidate: the nearest ones by cosine (bounds the nightly work).
PARTNERS_PER_CANDIDATE = 5
_BLOCK_ROWS = 512


def prefilter_pairs(
    rows: list[FactRow],
    vectors: np.ndarray,
    candidates: list[int],
    now: datetime,
    config: MaintenanceConfig,
) -> list[Pair]:
    """Pairs worth judging, best first, found without an LLM (seed 003 §4 pre-filters)."""
    unit = _normalised(vectors)
    by_scope: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_scope.setdefault(row.scope, []).append(i)
    wanted = set(candidates)
    recent = now - timedelta(days=config.dedup_recency_days)
    pairs: dict[tuple[str, str], Pair] = {}
    for members in by_scope.values():
        scope_candidates = [i for i in members if i in wanted]
        if len(members) < 2 or not scope_candidates:
            continue
        member_array = np.array(members)
        for start in range(0, len(scope_candidates), _BLOCK_ROWS):
            block = scope_candidates[start : start + _BLOCK_ROWS]
            scores = unit[block] @ unit[member_array].T
            k = min(PARTNERS_PER_CANDIDATE + 1, len(members))
            nearest = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            for row_in_block, candidate in enumerate(block):
                for column in nearest[row_in_block]:
                    other = int(member_array[column])
                    score = float(scores[row_in_block, column])
                    if other == candidate or score < config.dedup_cosine_min:
                        continue
                    a, b = sorted(
                        (rows[candidate], rows[other]), key=lambda r: (r.created_at, r.id)
                    )
                    if max(a.changed_at, b.changed_at) < recent or (a.id, b.id) in pairs:
                        continue
                    if numeric_step(a.content, b.content):
                        why = "numeric step"
                    elif lexical_overlap(a.content, b.content) >= config.dedup_min_overlap:
                        why = "lexical overlap"
                    else:
                        continue
                    pairs[(a.id, b.id)] = Pair(a, b, round(score, 4), why)
    return sorted(pairs.values(), key=lambda p: (-p.score, p.older.id, p.newer.id))


def judge_rules(pair: Pair) -> Verdict:
    """Same fact when the reconciler's rules call the newer a duplicate or an update."""
    relation, why = relate(pair.newer.content, pair.older.content, pair.score)
    return Verdict(relation in ("duplicate", "updates"), f"rules: {relation} ({why})")


def merge_messages(pairs: Sequence[Pair]) -> list[dict[str, str]]:
    listed = [{"pair": i, "a": p.older.content, "b": p.newer.content} for i, p in enumerate(pairs)]
    prompt = MERGE_PROMPT.format(pairs=json.dumps(listed, ensure_ascii=False, indent=2))
    return [{"role": "user", "content": prompt}]


def judge_llm(llm: LLMClient, pairs: Sequence[Pair]) -> list[Verdict]:
    """One request for a batch of pairs; pairs the model leaves out are judged by the rules."""
    answers = llm.complete_json(merge_messages(pairs), list[PairAnswer])
    by_pair = {answer.pair: answer for answer in answers}
    verdicts = []
    for i, pair in enumerate(pairs):
        answer = by_pair.get(i)
        if answer is None:
            verdicts.append(judge_rules(pair))
            continue
        text = " ".join((answer.text or "").split())
        valid = text if answer.same and 0 < len(text) <= MAX_FACT_CHARS else None
        verdicts.append(Verdict(answer.same, "llm", valid))
    return verdicts


#: Columns of a fact a merge reads and writes.
_MERGE_COLUMNS = (
    "id, content, conversation_id, source_ids, tags, importance, pinned, access_count, "
    "last_accessed, confidence, decay_rate"
)


def merge_rows(survivor: dict[str, Any], loser: dict[str, Any], text: str) -> dict[str, Any]:
    """The survivor after absorbing the loser: both provenances, the stronger of each signal."""
    accessed = [t for t in (survivor["last_accessed"], loser["last_accessed"]) if t is not None]
    return {
        **survivor,
        "content": text,
        "source_ids": list(
            dict.fromkeys([*survivor["source_ids"], *loser["source_ids"], loser["id"]])
        ),
        "tags": list(dict.fromkeys([*survivor["tags"], *loser["tags"]])),
        "importance": max(survivor["importance"], loser["importance"]),
        "pinned": survivor["pinned"] or loser["pinned"],
        "access_count": survivor["access_count"] + loser["access_count"],
        "last_accessed": max(accessed, default=None),
        "confidence": max(survivor["confidence"], loser["confidence"]),
        "decay_rate": min(survivor["decay_rate"], loser["decay_rate"]),
    }


def _apply_merges(
    writer: MemoryWriter, pairs: list[Pair], verdicts: list[Verdict], now: datetime
) -> tuple[list[str], list[tuple[str, str]]]:
    """Merge the pairs judged the same, in order; returns (survivor ids, judged fingerprints).

    A survivor may absorb several facts in one run (its provenance grows from merge to merge);
    a pair whose fact was merged away or reworded earlier in the run is not applied.
    """
    ids = list({i for p in pairs for i in (p.older.id, p.newer.id)})
    rows = {
        r["id"]: r
        for r in fetch_dicts(
            writer.con,
            f"SELECT {_MERGE_COLUMNS} FROM facts WHERE id IN (SELECT unnest(?::TEXT[]))",
            [ids],
        )
    }
    judged_text = {p.older.id: p.older.content for p in pairs}
    judged_text.update({p.newer.id: p.newer.content for p in pairs})
    checked: list[tuple[str, str]] = []
    losers: list[dict[str, Any]] = []
    survivors: dict[str, dict[str, Any]] = {}
    for pair, verdict in zip(pairs, verdicts, strict=True):
        older, newer = rows.get(pair.older.id), rows.get(pair.newer.id)
        if (
            older is None
            or newer is None
            or any(rows[i]["content"] != judged_text[i] for i in (older["id"], newer["id"]))
        ):
            # gone or reworded since it was judged: comes back with another score (so another
            # fingerprint) on a later night, if it still exists
            checked.append((pair.fingerprint, "superseded"))
            continue
        checked.append((pair.fingerprint, "same" if verdict.same else "different"))
        if not verdict.same:
            continue
        merged = merge_rows(newer, older, verdict.text or newer["content"])
        writer.history(
            newer["id"],
            "MERGE",
            old_ref=older["id"],
            new_ref=newer["id"],
            meta={
                "merged": older["id"],
                "old_text": newer["content"],
                "text": merged["content"],
                "merged_text": older["content"],
                "score": pair.score,
                "prefilter": pair.why,
                "verdict": verdict.reason,
                "source_ids": merged["source_ids"],
            },
        )
        writer.log_change(newer["conversation_id"], newer["id"], "merged", {"merged": older["id"]})
        losers.append({**older, "replaced_by": newer["id"], "score": pair.score})
        rows[newer["id"]] = survivors[newer["id"]] = merged
        del rows[older["id"]]
    survivors = {k: v for k, v in survivors.items() if k in rows}  # merged away later: gone
    _update_survivors(writer, list(survivors.values()))
    _soft_delete(
        writer,
        losers,
        event="MERGE",
        now=now,
        purge_days=None,
        meta=lambda row: {"merged_into": row["replaced_by"], "score": row["score"]},
        change=None,
    )
    relink = [(i, r["content"]) for i, r in survivors.items() if r["content"] != judged_text[i]]
    writer.link_entities(relink)
    return list(survivors), checked


def _update_survivors(writer: MemoryWriter, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("id", pa.string()),
                ("content", pa.string()),
                ("conversation_id", pa.string()),
                ("source_ids", pa.list_(pa.string())),
                ("tags", pa.list_(pa.string())),
                ("importance", pa.int32()),
                ("pinned", pa.bool_()),
                ("access_count", pa.int64()),
                ("last_accessed", pa.timestamp("us", tz="UTC")),
                ("confidence", pa.float64()),
                ("decay_rate", pa.float64()),
            ]
        ),
    )
    writer.con.register("_survivors", table)
    try:
        writer.con.execute(
            """
            UPDATE memories SET content = s.content, source_ids = s.source_ids, tags = s.tags,
                importance = s.importance, pinned = s.pinned, access_count = s.access_count,
                last_accessed = s.last_accessed, confidence = s.confidence,
                decay_rate = s.decay_rate
            FROM _survivors s WHERE memories.id = s.id
            """
        )
    finally:
        writer.con.unregister("_survivors")


def dedup_merge(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 003 §4: find near-duplicate facts and merge them, within a daily budget."""
    report = _report("dedup_merge")
    with _timed(report):
        now = _aware(now)
        provider = get_provider(settings)
        today = day_start(now)
        with open_store(settings.db_path) as con:
            con.execute(
                "DELETE FROM merge_fingerprints WHERE checked_at < ?",
                [now - timedelta(days=config.fingerprint_days)],
            )
            rows, vectors, _ = _load_facts(con, provider.name, provider.model)
            changed = _changed_times(con, now - timedelta(days=config.dedup_recency_days))
            known = {
                row[0]
                for row in con.execute("SELECT fingerprint FROM merge_fingerprints").fetchall()
            }
            judged_today = dict(
                con.execute(
                    "SELECT split_part(fingerprint, '|', 1), count(*) FROM merge_fingerprints "
                    "WHERE checked_at >= ? GROUP BY 1",
                    [today],
                ).fetchall()
            )
        for row in rows:
            row.changed_at = max(row.created_at, changed.get(row.id, row.created_at))
        vectors = _fill_vectors(settings, rows, vectors)
        candidates = candidate_pool(rows, now, config)
        pairs = prefilter_pairs(rows, vectors, candidates, now, config)

        # One pass per scope a day: a scope with pairs judged today waits for tomorrow.
        to_judge: list[Pair] = []
        budget: dict[str, int] = {}
        known_skipped = capped = done_today = 0
        for pair in pairs:
            scope = pair.newer.scope
            if scope in judged_today:
                done_today += 1
                continue
            if pair.fingerprint in known:
                known_skipped += 1
                continue
            left = budget.setdefault(scope, config.dedup_pairs_per_scope_per_day)
            if left <= 0:
                capped += 1
                continue
            budget[scope] = left - 1
            to_judge.append(pair)

        verdicts = _judge_all(settings, to_judge, config, report)
        with _writer(settings) as writer:
            merged, checked = _apply_merges(writer, to_judge, verdicts, now)
            _remember_pairs(writer.con, checked, now)
            report.preview = fetch_dicts(
                writer.con,
                "SELECT id, source_ids, content FROM memories "
                "WHERE id IN (SELECT unnest(?::TEXT[])) ORDER BY id LIMIT ?",
                [merged, PREVIEW_ROWS],
            )
        merges = sum(1 for _, verdict in checked if verdict == "same")
        report.counts.update(
            examined=len(candidates),
            merged=merges,
            soft_deleted=merges,
            pairs=len(pairs),
            judged=len(checked),
            skipped_known=known_skipped,
            capped=capped,
            done_today=done_today,
        )
        if merges:
            _refresh_index(settings, report)
    return report


def _remember_pairs(con: Any, checked: list[tuple[str, str]], now: datetime) -> None:
    """Judged pairs go to `merge_fingerprints`, so they are not judged again for 14 days."""
    rows = pa.table(
        {
            "fingerprint": [fingerprint for fingerprint, _ in checked],
            "verdict": [verdict for _, verdict in checked],
            "checked_at": pa.array([now] * len(checked), type=pa.timestamp("us", tz="UTC")),
        }
    )
    con.register("_judged", rows)
    try:
        con.execute("INSERT OR REPLACE INTO merge_fingerprints SELECT * FROM _judged")
    finally:
        con.unregister("_judged")


def _judge_all(
    settings: Settings, pairs: list[Pair], config: MaintenanceConfig, report: StageReport
) -> list[Verdict]:
    llm = _llm(settings)
    if llm is None:
        report.notes.append("judged by rules (no LLM configured): reconcile.relate")
        return [judge_rules(pair) for pair in pairs]
    verdicts: list[Verdict] = []
    failures = 0
    size = max(1, config.dedup_batch_pairs)
    for start in range(0, len(pairs), size):
        batch = pairs[start : start + size]
        try:
            verdicts.extend(judge_llm(llm, batch))
        except LLMError as error:
            failures += 1
            report.notes.append(f"LLM batch failed ({error}); judged by rules")
            verdicts.extend(judge_rules(pair) for pair in batch)
    report.counts["llm_batches"] = (len(pairs) + size - 1) // size
    report.counts["llm_failures"] = failures
    report.notes.append(f"judged by {settings.llm_model} in batches of {size}")
    return verdicts


# --------------------------------------------------------------------------- decay


def decay(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 004 Ebbinghaus decay, idempotent per day (see the module docstring)."""
    report = _report("decay")
    with _timed(report):
        as_of = day_start(now)
        with _writer(settings) as writer:
            con = writer.con
            examined = con.execute(
                f"SELECT count(*) FROM memories WHERE {_ACTIVE_SQL} AND decay_rate > 0"
            ).fetchone()[0]
            con.execute(
                f"""
                CREATE OR REPLACE TEMP TABLE _decay AS
                SELECT id, content, conversation_id, confidence AS before, decay_rate, ref,
                       confidence * exp(-decay_rate * (epoch(?::TIMESTAMPTZ) - epoch(ref))
                                        / 86400.0) AS after
                FROM (
                    SELECT *, greatest(
                        coalesce(last_accessed, created_at),
                        coalesce(TRY_CAST(json_extract_string(attributes, '$.decayed_at')
                                          AS TIMESTAMPTZ), created_at)) AS ref
                    FROM memories WHERE {_ACTIVE_SQL} AND decay_rate > 0
                )
                WHERE ref < ?
                """,
                [as_of, as_of],
            )
            con.execute(
                "UPDATE memories SET confidence = d.after, attributes = json_merge_patch("
                "coalesce(memories.attributes, '{}'::JSON), json_object('decayed_at', ?::VARCHAR))"
                " FROM _decay d WHERE memories.id = d.id",
                [as_of.isoformat()],
            )
            decayed = con.execute("SELECT count(*) FROM _decay").fetchone()[0]
            below = fetch_dicts(
                con,
                "SELECT id, content, conversation_id, before, after, decay_rate, ref FROM _decay "
                "WHERE after < ? ORDER BY id",
                [config.decay_threshold],
            )
            _soft_delete(
                writer,
                below,
                event="DECAY",
                now=_aware(now),
                purge_days=config.purge_after_days,
                meta=lambda row: {
                    "confidence_before": row["before"],
                    "confidence": row["after"],
                    "decay_rate": row["decay_rate"],
                    "since": row["ref"].isoformat(),
                    "threshold": config.decay_threshold,
                },
            )
            if decayed:
                writer.history(
                    None,
                    "DECAY",
                    meta={
                        "as_of": as_of.isoformat(),
                        "decayed": int(decayed),
                        "soft_deleted": len(below),
                        "threshold": config.decay_threshold,
                    },
                )
            con.execute("DROP TABLE _decay")
            report.preview = [
                {k: r[k] for k in ("id", "before", "after", "content")} for r in below
            ]
        report.preview = report.preview[:PREVIEW_ROWS]
        report.counts.update(examined=int(examined), decayed=int(decayed), soft_deleted=len(below))
        report.notes.append(f"decayed to {as_of.isoformat()}, threshold {config.decay_threshold}")
        if below:
            _refresh_index(settings, report)
    return report


# --------------------------------------------------------------------------- lifecycle


def lifecycle(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Purge what is past `purge_at`, then TTL (seed 003 §7) and eviction (seed 000 §4.5)."""
    report = _report("lifecycle")
    with _timed(report):
        now = _aware(now)
        today = day_start(now)  # cutoffs move once a day: a second run the same day is a no-op
        with _writer(settings) as writer:
            con = writer.con
            purged = _purge(writer, today)
            expired = fetch_dicts(
                con,
                f"""
                SELECT id, content, conversation_id, importance,
                       coalesce(last_accessed, created_at) AS last_seen
                FROM memories
                WHERE {_ACTIVE_SQL} AND NOT pinned AND decay_rate > 0 AND importance < ?
                  AND coalesce(last_accessed, created_at) <= ?
                ORDER BY id
                """,
                [config.ttl_importance_below, today - timedelta(days=config.ttl_days)],
            )
            _soft_delete(
                writer,
                expired,
                event="TTL",
                now=now,
                purge_days=config.purge_after_days,
                meta=lambda row: {
                    "last_seen": row["last_seen"].isoformat(),
                    "importance": row["importance"],
                    "ttl_days": config.ttl_days,
                },
            )
            evicted = fetch_dicts(
                con,
                f"""
                SELECT id, content, conversation_id, kind, total FROM (
                    SELECT id, content, conversation_id, kind, evictable,
                           count(*) OVER (PARTITION BY conversation_id) AS total,
                           row_number() OVER (
                               PARTITION BY conversation_id, evictable
                               ORDER BY created_at, coalesce(event_time, created_at), id) AS n
                    FROM (SELECT *, kind IN ('fact', 'episode') AND NOT pinned AS evictable
                          FROM memories WHERE {_ACTIVE_SQL} AND conversation_id IS NOT NULL)
                )
                WHERE evictable AND n <= total - ?
                ORDER BY conversation_id, n
                """,
                [config.max_entries],
            )
            _soft_delete(
                writer,
                evicted,
                event="EVICT",
                now=now,
                purge_days=config.purge_after_days,
                meta=lambda row: {"entries": row["total"], "max_entries": config.max_entries},
            )
            report.preview = [
                {"id": r["id"], "why": why, "content": r["content"]}
                for why, rows in (("ttl", expired), ("evicted", evicted))
                for r in rows[:PREVIEW_ROWS]
            ]
        report.counts.update(
            examined=len(expired) + len(evicted) + purged,
            soft_deleted=len(expired) + len(evicted),
            purged=purged,
            expired=len(expired),
            evicted=len(evicted),
        )
        if expired or evicted or purged:
            _refresh_index(settings, report)
    return report


def _purge(writer: MemoryWriter, cutoff: datetime) -> int:
    """Remove soft-deleted rows whose `purge_at` is at or before `cutoff`, with their entity
    links and relations (their history stays: it is the audit trail)."""
    con = writer.con
    rows = fetch_dicts(
        con,
        "SELECT id, content, conversation_id, purge_at FROM memories "
        "WHERE state = 'soft_deleted' AND purge_at IS NOT NULL AND purge_at <= ? ORDER BY id",
        [cutoff],
    )
    ids = [row["id"] for row in rows]
    for row in rows:
        meta = {"text": row["content"], "purge_at": row["purge_at"].isoformat()}
        writer.history(row["id"], "PURGE", old_ref=row["id"], meta=meta)
        writer.log_change(row["conversation_id"], row["id"], "deleted", {"job": "purge"})
    if ids:
        _unlink_entities(con, ids)
        con.execute(
            "DELETE FROM relations WHERE from_id IN (SELECT unnest(?::TEXT[])) "
            "OR to_id IN (SELECT unnest(?::TEXT[]))",
            [ids, ids],
        )
        con.execute("DELETE FROM memories WHERE id IN (SELECT unnest(?::TEXT[]))", [ids])
    return len(ids)


# --------------------------------------------------------------------------- reflection

REFLECTION_PROMPT = """\
Write this week's reflection for a long-term memory: what stands out across the facts and \
conversation turns below (recurring themes, priorities, changes, open plans).

Rules: 2-4 sentences, third person, name people instead of using pronouns, neutral tone, at \
most 600 characters, only what the input says. Answer with the reflection text only.

Facts of the week:
{facts}

Conversation turns of the week:
{episodes}
"""


def _scope_rows(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["scope"], []).append(row)
    return grouped


#: Facts an extractive reflection keeps: the week's most important ones.
EXTRACTIVE_FACTS = 5


def reflection_text(
    llm: LLMClient | None, facts: list[dict[str, Any]], episodes: list[dict[str, Any]]
) -> tuple[str, str]:
    """(text, method): the LLM's reflection, else the week's most important facts in the
    order they were learnt (importance, then recency, decides which)."""
    if llm is not None:
        prompt = REFLECTION_PROMPT.format(
            facts="\n".join(f"- {f['content']}" for f in facts),
            episodes="\n".join(
                f"- {e['speaker'] or e['role'] or '?'}: {e['content']}" for e in episodes
            )
            or "(none)",
        )
        try:
            answer = llm.complete([{"role": "user", "content": prompt}], max_tokens=300)
            text = " ".join(answer.split())
            if text:
                return text[:MAX_REFLECTION_CHARS], "llm"
        except LLMError:
            pass  # the extractive reflection below is the fallback
    ranked = sorted(facts, key=lambda f: (-f["importance"], -f["created_at"].timestamp(), f["id"]))
    kept = sorted(ranked[:EXTRACTIVE_FACTS], key=lambda f: (f["created_at"], f["id"]))
    text = " ".join(f["content"].strip() for f in kept)
    return text[:MAX_REFLECTION_CHARS], "extractive"


def reflection(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 004 weekly reflection per scope: once per 6 days, with >= 3 facts of the week."""
    report = _report("reflection")
    with _timed(report):
        now = _aware(now)
        since = now - timedelta(days=config.reflection_window_days)
        with open_store(settings.db_path) as con:
            facts = _scope_rows(
                fetch_dicts(
                    con,
                    f"SELECT id, content, {_SCOPE_SQL} AS scope, created_at, importance "
                    "FROM facts WHERE created_at > ? AND created_at <= ? "
                    "ORDER BY created_at DESC, id",
                    [since, now],
                )
            )
            episodes = _scope_rows(
                fetch_dicts(
                    con,
                    f"SELECT id, content, {_SCOPE_SQL} AS scope, speaker, source_role AS role, "
                    "coalesce(event_time, created_at) AS happened_at FROM memories "
                    f"WHERE kind = 'episode' AND {_ACTIVE_SQL} "
                    "AND coalesce(event_time, created_at) > ? "
                    "AND coalesce(event_time, created_at) <= ? ORDER BY happened_at DESC, id",
                    [since, now],
                )
            )
            last = dict(
                con.execute(
                    f"SELECT {_SCOPE_SQL}, max(created_at) FROM memories "
                    "WHERE kind = 'reflection' AND list_contains(tags, ?) GROUP BY 1",
                    [REFLECTION_TAG],
                ).fetchall()
            )
        llm = _llm(settings)
        drafts: list[NewMemory] = []
        for scope, scope_facts in sorted(facts.items()):
            previous = last.get(scope)
            if previous is not None and now - previous < timedelta(days=config.reflection_min_days):
                report.notes.append(f"{scope}: skipped, last reflection {previous:%Y-%m-%d %H:%M}")
                continue
            if len(scope_facts) < config.reflection_min_facts:
                report.notes.append(f"{scope}: skipped, {len(scope_facts)} facts this week")
                continue
            used_facts = scope_facts[: config.reflection_max_inputs]
            used_episodes = episodes.get(scope, [])[: config.reflection_max_inputs]
            text, method = reflection_text(llm, used_facts, list(reversed(used_episodes)))
            user_id, conversation_id = scope_owner(scope)
            drafts.append(
                NewMemory(
                    content=text,
                    kind="reflection",
                    conversation_id=conversation_id,
                    user_id=user_id,
                    source_role=ACTOR,
                    importance=3,
                    event_time=now,
                    source_ids=[f["id"] for f in used_facts],
                    tags=[REFLECTION_TAG],
                    decay_rate=0.0,
                    attributes={
                        "method": method,
                        "window_start": since.isoformat(),
                        "window_end": now.isoformat(),
                        "facts": len(used_facts),
                        "episodes": len(used_episodes),
                    },
                )
            )
        if drafts:
            with _writer(settings) as writer:
                ids = [writer.add(draft, meta={"job": "reflection"}) for draft in drafts]
            report.preview = [
                {"id": i, "content": d.content} for i, d in zip(ids, drafts, strict=True)
            ]
        report.counts.update(examined=len(facts), created=len(drafts))
        if drafts:
            _refresh_index(settings, report)
    return report


# --------------------------------------------------------------------------- insights

INSIGHTS_PROMPT = """\
From the recent activity of a user below, infer 1 to 3 insights about the user's emotions, \
trust, relationships, communication style or how the user's preferences are evolving.

Rules: third person; name people instead of using pronouns; never refer to the AI or the \
assistant; each insight at most 280 characters; only what the input supports. When nothing \
stands out answer {{"insights": []}}.

Latest activity:
{activity}

New facts:
{facts}

Recent conversation:
{snippet}

Answer with JSON only, no prose and no code fences:
{{"insights": [{{"summary": "...", "tags": ["..."], "importance": 2}}]}}
"""


class InsightItem(BaseModel):
    summary: str
    tags: list[str] = Field(default_factory=list)
    importance: int = 2


class InsightAnswer(BaseModel):
    insights: list[InsightItem] = Field(default_factory=list)


def insight_texts(answer: InsightAnswer) -> list[tuple[str, list[str]]]:
    """The valid insights of an answer: non-empty, at most 280 characters, at most 3."""
    kept = []
    for item in answer.insights:
        text = " ".join(item.summary.split())
        if text and len(text) <= MAX_FACT_CHARS:
            kept.append((text, [t.strip().lower() for t in item.tags if t.strip()]))
    return kept[:3]


def insights(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 003 §3 theory-of-mind insights per scope with new facts, at most once per 24 h."""
    report = _report("insights")
    with _timed(report):
        llm = _llm(settings)
        if llm is None:
            report.skipped = True
            report.notes.append(
                "skipped: insights need an LLM (no LLM configured); rules cannot infer trust, "
                "emotions or relationship dynamics honestly"
            )
            return report
        now = _aware(now)
        since = now - timedelta(hours=config.insights_cooldown_hours)
        with open_store(settings.db_path) as con:
            new_facts = _scope_rows(
                fetch_dicts(
                    con,
                    f"SELECT id, content, {_SCOPE_SQL} AS scope, created_at FROM facts "
                    "WHERE created_at > ? AND created_at <= ? ORDER BY created_at DESC, id",
                    [since, now],
                )
            )
            recent_runs = {
                row[0]
                for row in con.execute(
                    "SELECT json_extract_string(meta, '$.scope') FROM events "
                    "WHERE node = ? AND op = 'insights' AND status = 'ok' AND ts > ?",
                    [ACTOR, since],
                ).fetchall()
            }
            inputs = {
                scope: _insight_inputs(con, scope, rows[:3])
                for scope, rows in new_facts.items()
                if scope not in recent_runs
            }
        results: dict[str, list[tuple[str, list[str]]]] = {}
        failed: dict[str, str] = {}
        for scope, prompt in sorted(inputs.items()):
            try:
                answer = llm.complete_json(
                    [{"role": "user", "content": prompt}],
                    InsightAnswer,
                    max_tokens=config.insights_max_tokens,
                )
                results[scope] = insight_texts(answer)
            except LLMError as error:
                failed[scope] = str(error)
        created = 0
        with _writer(settings) as writer:
            for scope, found in results.items():
                user_id, conversation_id = scope_owner(scope)
                source_ids = [f["id"] for f in new_facts[scope][:3]]
                for text, tags in found:
                    writer.add(
                        NewMemory(
                            content=text,
                            kind="insight",
                            conversation_id=conversation_id,
                            user_id=user_id,
                            source_role=ACTOR,
                            category=INSIGHT_CATEGORY,
                            importance=2,
                            event_time=now,
                            source_ids=source_ids,
                            tags=tags,
                        ),
                        meta={"job": "insights"},
                    )
                    created += 1
                writer.record_event(
                    ACTOR,
                    "insights",
                    "ok",
                    conversation_id=conversation_id,
                    detail=f"{len(found)} insights",
                    meta={"scope": scope, "created": len(found), "as_of": now.isoformat()},
                )
            for scope, error in failed.items():
                writer.record_event(
                    ACTOR,
                    "insights",
                    "error",
                    conversation_id=scope_owner(scope)[1],
                    detail=error,
                    meta={"scope": scope},
                )
        skipped = len(new_facts) - len(inputs)
        if skipped:
            report.notes.append(f"{skipped} scopes had insights in the last 24 h: skipped")
        if failed:
            report.notes.append(f"LLM failed for {len(failed)} scopes (see events)")
        report.counts.update(examined=len(new_facts), created=created, llm_failures=len(failed))
        if created:
            _refresh_index(settings, report)
    return report


def _insight_inputs(con: Any, scope: str, new_facts: list[dict[str, Any]]) -> str:
    """Seed 003 §3 input: <= 5 activity items, <= 3 new facts, <= 1,000 chars of conversation."""
    exclude = [f["id"] for f in new_facts]
    activity = con.execute(
        f"SELECT content FROM memories WHERE {_ACTIVE_SQL} AND {_SCOPE_SQL} = ? "
        "AND kind IN ('fact', 'summary', 'reflection') AND id NOT IN (SELECT unnest(?::TEXT[])) "
        "ORDER BY created_at DESC, id LIMIT 5",
        [scope, exclude],
    ).fetchall()
    turns = con.execute(
        f"SELECT coalesce(speaker, source_role, '?'), content FROM memories "
        f"WHERE kind = 'episode' AND {_ACTIVE_SQL} AND {_SCOPE_SQL} = ? "
        "ORDER BY coalesce(event_time, created_at) DESC, line DESC LIMIT 20",
        [scope],
    ).fetchall()
    snippet: list[str] = []
    size = 0
    for speaker, content in turns:
        line = f"{speaker}: {content}"
        if size + len(line) > 1000:
            break
        snippet.insert(0, line)
        size += len(line) + 1
    return INSIGHTS_PROMPT.format(
        activity="\n".join(f"- {row[0]}" for row in activity) or "(none)",
        facts="\n".join(f"- {f['content']}" for f in new_facts),
        snippet="\n".join(snippet) or "(none)",
    )


# --------------------------------------------------------------------------- procedural memory


def remember_procedure(
    settings: Settings,
    steps: Sequence[str],
    *,
    title: str | None = None,
    conversation_id: str | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    importance: int = 3,
    pinned: bool = False,
    actor: str = "agent",
    refresh: bool = True,
) -> str:
    """Store a how-to as numbered steps (seed 003 §12); returns the memory id.

    Category `procedural`, so default retrieval leaves it out and only agents that ask for the
    category get it. `decay_rate` 0: a procedure is removed by forgetting it, not by time.
    """
    from memory_dag.memory_ops import MemoryOpError, refresh_index

    cleaned = [" ".join(step.split()) for step in steps if step.strip()]
    if not cleaned:
        raise MemoryOpError("a procedure needs at least one step")
    header = f"{' '.join(title.split())}:\n" if title and title.strip() else ""
    content = header + "\n".join(f"{n}. {step}" for n, step in enumerate(cleaned, 1))
    if len(content) > MAX_PROCEDURE_CHARS:
        raise MemoryOpError(f"a procedure is at most {MAX_PROCEDURE_CHARS} characters")
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=actor)
        with writer.transaction():
            memory_id = writer.add(
                NewMemory(
                    content=content,
                    kind="procedural",
                    conversation_id=conversation_id,
                    session_id=session_id,
                    user_id=user_id,
                    agent_id=agent_id,
                    source_role=actor,
                    category=PROCEDURAL_CATEGORY,
                    importance=importance,
                    tags=list(tags),
                    decay_rate=0.0,
                    attributes={"steps": len(cleaned)},
                ),
                meta={"op": "remember_procedure"},
            )
            if pinned:
                con.execute("UPDATE memories SET pinned = true WHERE id = ?", [memory_id])
    if refresh:
        refresh_index(settings)
    return memory_id


# --------------------------------------------------------------------------- the nightly set

Job = Callable[..., StageReport]

#: Every job by name, in the order the schedules run them in a night.
JOBS: dict[str, Job] = {
    "entity_enrichment": entity_enrichment,  # 02:00
    "session_consolidation": consolidate_pending,  # 03:00
    "reflection": reflection,  # Sundays 03:00, after the night's consolidation
    "dedup_merge": dedup_merge,  # 03:30
    "decay": decay,  # 04:00
    "lifecycle": lifecycle,  # 04:30
    "insights": insights,  # background
}


def run_nightly(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> list[StageReport]:
    """Every job once, in schedule order (the CLI and the benchmark; Dagster runs them apart)."""
    return [job(settings, now, config=config) for job in JOBS.values()]
