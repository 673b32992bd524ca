"""The read path after hybrid search: the stages that decide which memories an agent sees.

Seed 000 §3 (rerank, threshold, recency, MMR), seed 003 §2 and §3 (relation boost, low weight
for insights), seed 004 (RRF of text, vector and entity rankings). Every stage can be switched
off in `RetrievalConfig`, and `RetrievalResult.stages` records which ran and why not:

1. candidates  `Searcher.search` with k = max(top_k · pool_factor, min_pool): filters apply
               inside the index; relevance starts as the fused search score.
2. liveness    memories soft-deleted or expired since the index was published are dropped
               (a snapshot of the store's inactive ids and relations, read again only when
               the store file changed; without one, when the store is busy, the stage says so).
3. entities    with fusion "rrf", candidates linked to an entity the query names form a third
               ranking: relevance = Σ 1/(60 + rank) over text, vector and entity rankings,
               divided by its maximum (1.0 = first everywhere).
4. rerank      relevance = sigmoid(cross-encoder logit) when a model is configured.
5. threshold   candidates with relevance < score_threshold are dropped.
6. recency     score = (1 − w)·relevance + w·exp(−age_days / 30).
7. relations   score += w_rel · (strongest relation to a live memory). The related memories
               offered beside the results are other candidates of the pool, so they passed
               the same filters (categories, user) inside the index.
8. insight     score ·= insight_weight for `insight` memories.
9. mmr         greedy λ·score − (1 − λ)·max cosine to what is already selected, over the
               candidates' index vectors, with the scores min-max scaled to [0, 1] over the
               pool first: cosines span [0, 1], while fused scores crowd into ~0.3–0.7 (the
               z-score's sigmoid), where λ = 0.7 would rank an unrelated memory above a
               relevant one that is merely similar to the first pick. Without mmr: the top_k.

The ids of the returned memories go to an access log (queue files next to the store) that a
pipeline run adds to `access_count` / `last_accessed` (`apply_access_log`): a read never
writes to DuckDB, whose single writer may be busy.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from memory_dag.config import Settings
from memory_dag.entities import extract_entities
from memory_dag.ids import episode_id
from memory_dag.index_files import PublishedIndex
from memory_dag.reranker import load_reranker
from memory_dag.search import Fusion, Searcher, SearchFilters, SearchHit, get_searcher
from memory_dag.store import StoreLockedError, insert_arrow, open_store, to_json

RRF_K = 60
SECONDS_PER_DAY = 86_400.0


class RetrievalConfig(BaseModel):
    """The stages of the read path and their parameters (defaults from seeds 000, 003, 004)."""

    fusion: Fusion | None = Field(None, description="None: the Settings' fusion (zscore)")
    #: Seed 000: top_k × 3 candidates; at least `min_pool` so MMR and pruning have a choice.
    pool_factor: int = Field(3, ge=1)
    min_pool: int = Field(30, ge=1)
    #: Look at the store (liveness, relations, entities); off = the index alone.
    store_signals: bool = True
    #: Seconds to wait for the store when a pipeline holds it; 0 = skip those stages at once.
    store_lock_timeout: float = Field(0.0, ge=0.0)
    entities: bool = True
    rerank: bool = True
    reranker_model: str | None = None
    threshold: bool = True
    score_threshold: float = Field(0.35, ge=0.0, le=1.0)
    recency: bool = True
    recency_weight: float = Field(0.2, ge=0.0, le=1.0)
    recency_scale_days: float = Field(30.0, gt=0.0)
    relations: bool = True
    relation_weight: float = Field(0.1, ge=0.0)
    insight: bool = True
    insight_weight: float = Field(0.5, ge=0.0, le=1.0)
    mmr: bool = True
    mmr_lambda: float = Field(0.7, ge=0.0, le=1.0)
    track_access: bool = True


# --- stage arithmetic (pure functions, pinned by the tests) ---------------------------------


def rrf_scores(rankings: Sequence[Sequence[Any]], k: int = RRF_K) -> dict[Any, float]:
    """Seed 004: score(x) = Σ over the rankings that hold x of 1 / (k + rank), rank from 1."""
    scores: dict[Any, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return scores


def recency_score(age_days: float, scale_days: float = 30.0) -> float:
    """exp(−age/scale); a date in the future counts as now."""
    return math.exp(-max(age_days, 0.0) / scale_days)


def with_recency(relevance: float, recency: float, weight: float) -> float:
    """Seed 000 §3 step 3: (1 − w)·relevance + w·recency."""
    return (1.0 - weight) * relevance + weight * recency


def min_max(values: np.ndarray) -> np.ndarray:
    """Values scaled to [0, 1] (all ones when they are equal)."""
    if len(values) == 0 or values.min() == values.max():
        return np.ones(len(values))
    return (values - values.min()) / (values.max() - values.min())


def mmr_order(scores: np.ndarray, vectors: np.ndarray, k: int, lam: float) -> list[int]:
    """Positions chosen greedily by λ·score − (1 − λ)·max cosine to the chosen ones.

    The first pick is the best score. Vectors are normalised here, so any scale works.
    """
    count = len(scores)
    if count == 0 or k <= 0:
        return []
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors, dtype=np.float64), where=norms > 0)
    similarity = unit @ unit.T
    chosen: list[int] = []
    max_sim = np.full(count, -np.inf)
    available = np.ones(count, dtype=bool)
    for _ in range(min(k, count)):
        penalty = np.where(np.isfinite(max_sim), max_sim, 0.0)
        value = np.where(available, lam * scores - (1.0 - lam) * penalty, -np.inf)
        pick = int(np.argmax(value))
        chosen.append(pick)
        available[pick] = False
        max_sim = np.maximum(max_sim, similarity[pick])
    return chosen


# --- results -------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One search hit on its way through the stages, with every signal that moved it."""

    hit: SearchHit
    #: Rows of `memories` behind the hit: the memory itself, or the episodes of a chunk.
    memory_ids: list[str]
    #: The whole text of the index row (the hit's snippet is cut at 700 characters).
    text: str
    fused: float
    relevance: float
    score: float = 0.0
    recency: float | None = None
    relation_strength: float = 0.0
    entity_matches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.hit.to_dict(),
            "memory_ids": self.memory_ids,
            "text": self.text,
            "fused": round(self.fused, 6),
            "relevance": round(self.relevance, 6),
            "score": round(self.score, 6),
            "recency": None if self.recency is None else round(self.recency, 6),
            "relation_strength": round(self.relation_strength, 6),
            "entity_matches": self.entity_matches,
        }


@dataclass
class StageRun:
    """Whether a stage ran, how many candidates it left, and a word on why (not)."""

    name: str
    ran: bool
    detail: str = ""
    remaining: int | None = None


@dataclass
class RelatedMemory:
    """A candidate linked (relations table) to one of the results but not itself a result."""

    id: str
    text: str
    category: str | None
    role: str | None
    kind: str
    strength: float
    related_to: str


@dataclass
class RetrievalResult:
    query: str
    items: list[Candidate]
    stages: list[StageRun]
    related: list[RelatedMemory] = field(default_factory=list)
    #: "reranker" when a cross-encoder scored relevance, else "fused" (the search score).
    relevance_source: Literal["reranker", "fused"] = "fused"

    def stage(self, name: str) -> StageRun:
        return next(s for s in self.stages if s.name == name)

    def ran(self) -> list[str]:
        return [s.name for s in self.stages if s.ran]

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "relevance_source": self.relevance_source,
            "items": [c.to_dict() for c in self.items],
            "stages": [vars(s) for s in self.stages],
            "related": [vars(r) for r in self.related],
        }


# --- store signals -------------------------------------------------------------------------


@dataclass
class StoreSignals:
    """What the store knows about memories that the published index may not (yet)."""

    #: (size, mtime) of the store file and its WAL when this was read.
    signature: tuple[int, ...] = ()
    #: Ids of soft-deleted or expired memories.
    dead: set[str] = field(default_factory=set)
    #: memory id → [(related live memory id, strength)], strongest first, either direction.
    edges: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    #: memory id → how many entities named by the query it is linked to (per query).
    entity_matches: dict[str, int] = field(default_factory=dict)


def store_signature(db_path: Path) -> tuple[int, ...] | None:
    """Changes whenever DuckDB writes the store (the file or its WAL); None: no store."""
    parts: list[int] = []
    for path in (db_path, db_path.with_name(db_path.name + ".wal")):
        try:
            stat = path.stat()
        except FileNotFoundError:
            if path == db_path:
                return None
            continue
        parts += [stat.st_size, stat.st_mtime_ns]
    return tuple(parts)


_snapshots: dict[Path, StoreSignals] = {}
_snapshots_lock = threading.Lock()


def store_snapshot(db_path: Path, lock_timeout: float = 0.0) -> tuple[StoreSignals | None, str]:
    """Inactive ids and live relations of the store, read again only after it changed.

    A short read-only connection costs tens of milliseconds (more on a busy machine), so the
    hot path reads the whole of both once per store version, as the index is loaded once per
    version. While a pipeline holds the store the last snapshot is used, or none.
    """
    signature = store_signature(db_path)
    if signature is None:
        return None, "no store"
    key = db_path.resolve()
    with _snapshots_lock:
        cached = _snapshots.get(key)
        if cached is not None and cached.signature == signature:
            return cached, "snapshot"
        try:
            with open_store(db_path, read_only=True, lock_timeout=lock_timeout) as con:
                snapshot = _read_snapshot(con, signature)
        except StoreLockedError:
            if cached is not None:
                return cached, "store busy: the last snapshot"
            return None, "store busy (a pipeline holds it)"
        _snapshots[key] = snapshot
        return snapshot, "read"


def _read_snapshot(con: Any, signature: tuple[int, ...]) -> StoreSignals:
    dead = con.execute(
        "SELECT id FROM memories WHERE valid_until IS NOT NULL OR state <> 'active'"
    ).fetchall()
    edges = con.execute(
        """
        SELECT r.from_id, r.to_id, r.strength
        FROM relations r
        JOIN memories a ON a.id = r.from_id JOIN memories b ON b.id = r.to_id
        WHERE a.valid_until IS NULL AND a.state = 'active'
          AND b.valid_until IS NULL AND b.state = 'active'
        ORDER BY r.strength DESC, r.from_id, r.to_id
        """
    ).fetchall()
    snapshot = StoreSignals(signature=signature, dead={row[0] for row in dead})
    for from_id, to_id, strength in edges:
        snapshot.edges.setdefault(from_id, []).append((to_id, strength))
        snapshot.edges.setdefault(to_id, []).append((from_id, strength))
    return snapshot


def entity_matches(
    db_path: Path, memory_ids: list[str], names: list[str], lock_timeout: float = 0.0
) -> dict[str, int] | None:
    """memory id → entities among `names` it is linked to; None when the store is busy."""
    if not memory_ids or not names:
        return {}
    try:
        with open_store(db_path, read_only=True, lock_timeout=lock_timeout) as con:
            rows = con.execute(
                """
                SELECT me.memory_id, count(DISTINCT me.entity_id)
                FROM memory_entities me JOIN entities e ON e.id = me.entity_id
                WHERE me.memory_id IN (SELECT unnest(?::TEXT[]))
                  AND (lower(e.canonical_name) IN (SELECT unnest(?::TEXT[]))
                       OR len(list_intersect(list_transform(e.aliases, a -> lower(a)),
                                             ?::TEXT[])) > 0)
                GROUP BY me.memory_id
                """,
                [memory_ids, names, names],
            ).fetchall()
    except (FileNotFoundError, StoreLockedError):
        return None
    return dict(rows)


def memory_ids_of(hit: SearchHit) -> list[str]:
    """The `memories` rows behind a hit: a derived memory, or the episodes of a transcript chunk."""
    if hit.source == "memories":
        return [hit.id]
    if hit.kind == "transcript":
        return [episode_id(hit.path, turn_id) for turn_id in hit.turn_ids]
    return []


def query_entity_names(query: str) -> list[str]:
    """Lower-cased names and canonical forms of the entities a query mentions."""
    names = set()
    for mention in extract_entities(query):
        names.add(mention.text.strip().lower())
        names.add(mention.canonical.strip().lower())
    return sorted(n for n in names if n)


def related_candidates(
    items: list[Candidate], candidates: list[Candidate], signals: StoreSignals | None
) -> list[RelatedMemory]:
    """Candidates linked to a result but not shown, strongest link first.

    Only candidates qualify: they come from the same filtered search, so a relation never
    reaches past the categories or the user the request may read.
    """
    if signals is None:
        return []
    by_memory = {i: c for c in candidates for i in c.memory_ids}
    shown = {i for c in items for i in c.memory_ids}
    related: dict[str, RelatedMemory] = {}
    for item in items:
        for memory_id in item.memory_ids:
            for other, strength in signals.edges.get(memory_id, []):
                candidate = by_memory.get(other)
                if candidate is None or other in shown:
                    continue
                if other in related and related[other].strength >= strength:
                    continue
                hit = candidate.hit
                related[other] = RelatedMemory(
                    other, candidate.text, hit.category, hit.role, hit.kind, strength, memory_id
                )
    return sorted(related.values(), key=lambda r: -r.strength)


# --- access tracking -----------------------------------------------------------------------


def access_log_dir(settings: Settings) -> Path:
    """Queue folder next to the store: `data/memory.duckdb` → `data/memory.access/`."""
    db_path = Path(settings.db_path)
    return db_path.with_name(db_path.stem + ".access")


class AccessLog:
    """Buffers the ids of returned memories; a daemon thread writes them to queue files.

    A read must not wait for the store's single writer, so `record` only appends to a list.
    The thread (and `atexit`) writes each batch as its own JSON-lines file, renamed into
    place so `apply_access_log` never sees half a file. Counting happens at the next
    pipeline run (`apply_access_log`), which is also the only writer.
    """

    def __init__(self, folder: Path, *, flush_seconds: float = 2.0) -> None:
        self.folder = folder
        self.flush_seconds = flush_seconds
        self._pending: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        atexit.register(self.flush)

    def record(self, memory_ids: Iterable[str], at: datetime | None = None) -> None:
        stamp = (at or datetime.now(UTC)).isoformat()
        with self._lock:
            self._pending.extend((memory_id, stamp) for memory_id in memory_ids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="memory-access-log", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.flush_seconds)  # gather a batch
            self._wake.clear()
            self.flush()

    def flush(self) -> int:
        """Write what is buffered as one queue file; returns the number of accesses written."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return 0
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging = self.folder / f".{name}.tmp"
        staging.write_text("".join(json.dumps({"id": i, "at": t}) + "\n" for i, t in batch))
        os.replace(staging, self.folder / f"{name}.jsonl")
        return len(batch)


_access_logs: dict[Path, AccessLog] = {}
_access_logs_lock = threading.Lock()


def get_access_log(settings: Settings) -> AccessLog:
    """One access log per store and process."""
    folder = access_log_dir(settings).resolve()
    with _access_logs_lock:
        log = _access_logs.get(folder)
        if log is None:
            log = _access_logs[folder] = AccessLog(folder)
        return log


def apply_access_log(settings: Settings) -> dict[str, int]:
    """Add the queued accesses to `memories.access_count` / `last_accessed` (a pipeline step).

    Exactly once: each queue file's name is recorded in `events` (node 'retrieval', op
    'access') in the same transaction as its counts, and files already recorded are skipped.
    """
    folder = access_log_dir(settings)
    files = sorted(folder.glob("*.jsonl")) if folder.exists() else []
    counts = {"files": 0, "accesses": 0, "memories": 0}
    if not files:
        return counts
    with open_store(settings.db_path) as con:
        done = {
            row[0]
            for row in con.execute(
                "SELECT detail FROM events WHERE node = 'retrieval' AND op = 'access' "
                "AND detail IN (SELECT unnest(?::TEXT[]))",
                [[f.name for f in files]],
            ).fetchall()
        }
        todo = [f for f in files if f.name not in done]
        ids: list[str] = []
        stamps: list[datetime] = []
        for path in todo:
            for line in path.read_text().splitlines():
                record = json.loads(line)
                ids.append(record["id"])
                stamps.append(datetime.fromisoformat(record["at"]))
        accesses = pa.table({"id": pa.array(ids, pa.string()), "accessed_at": pa.array(stamps)})
        con.execute("BEGIN TRANSACTION")
        try:
            con.register("_accesses", accesses)
            updated = con.execute(
                """
                UPDATE memories SET
                    access_count = access_count + a.n,
                    last_accessed = greatest(coalesce(memories.last_accessed, a.latest), a.latest)
                FROM (SELECT id, count(*) AS n, max(accessed_at) AS latest
                      FROM _accesses GROUP BY id) a
                WHERE memories.id = a.id
                """
            ).fetchone()[0]
            con.unregister("_accesses")
            events = pa.table(
                {
                    "id": [uuid.uuid4().hex for _ in todo],
                    "node": ["retrieval"] * len(todo),
                    "op": ["access"] * len(todo),
                    "status": ["ok"] * len(todo),
                    "detail": [f.name for f in todo],
                    "meta": [to_json({"accesses": len(ids)})] * len(todo),
                }
            )
            insert_arrow(con, "events", events)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    for path in files:
        path.unlink(missing_ok=True)
    counts.update(files=len(todo), accesses=len(ids), memories=int(updated))
    return counts


# --- the pipeline --------------------------------------------------------------------------


class Retriever:
    """The configured read path over the current published index."""

    def __init__(
        self,
        settings: Settings,
        config: RetrievalConfig | None = None,
        *,
        searcher: Searcher | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self.settings = settings
        self.config = config or RetrievalConfig()
        self._searcher = searcher
        self.reranker = load_reranker(self.config.reranker_model) if self.config.rerank else None
        self.access_log = access_log

    @property
    def searcher(self) -> Searcher:
        """The given searcher, or the one for the index version live right now."""
        return self._searcher if self._searcher is not None else get_searcher(self.settings)

    def retrieve(
        self,
        query: str,
        *,
        top_k: int = 5,
        filters: SearchFilters | None = None,
        threshold: float | None = None,
        exclude_session: str | None = None,
        now: datetime | None = None,
    ) -> RetrievalResult:
        """Run the stages; `threshold` overrides `score_threshold` for this call.

        `exclude_session` drops that session's candidates from the pool (seed 004: inject only
        what earlier sessions said); `pool_factor` leaves enough candidates for top_k.
        """
        config = self.config
        searcher = self.searcher  # one index version for the whole call
        now = now or datetime.now(UTC)
        fusion = config.fusion or self.settings.fusion
        stages: list[StageRun] = []
        pool_size = max(top_k * config.pool_factor, config.min_pool)
        hits = searcher.search(query, k=pool_size, filters=filters, min_score=0.0, fusion=fusion)
        if exclude_session is not None:
            hits = [h for h in hits if h.session_id != exclude_session]
        texts = searcher.index.rows["text"]
        pool = [Candidate(h, memory_ids_of(h), texts[h.row], h.score, h.score) for h in hits]
        stages.append(StageRun("candidates", True, f"fusion {fusion}", len(pool)))

        pool, signals = self._liveness_stage(query, pool, fusion, stages)
        self._entity_stage(pool, signals, fusion, stages)
        source = self._rerank_stage(query, pool, stages)
        candidates = list(pool)  # before the threshold: related memories need not match
        pool = self._threshold_stage(pool, threshold, stages)
        for candidate in pool:
            candidate.score = candidate.relevance
        self._recency_stage(pool, now, stages)
        self._relations_stage(pool, signals, stages)
        self._insight_stage(pool, stages)
        items = self._select(pool, top_k, searcher.index, stages)

        shown = {i for c in items for i in c.memory_ids}
        related = related_candidates(items, candidates, signals) if config.relations else []
        if config.track_access and shown:
            log = self.access_log or get_access_log(self.settings)
            log.record([i for c in items for i in c.memory_ids], now)
        return RetrievalResult(query, items, stages, related, source)

    # --- stages ------------------------------------------------------------------------------

    def _liveness_stage(
        self, query: str, pool: list[Candidate], fusion: str, stages: list[StageRun]
    ) -> tuple[list[Candidate], StoreSignals | None]:
        config = self.config
        if not config.store_signals:
            stages.append(StageRun("liveness", False, "store signals off"))
            return pool, None
        db_path = Path(self.settings.db_path)
        snapshot, why = store_snapshot(db_path, config.store_lock_timeout)
        if snapshot is None:
            stages.append(StageRun("liveness", False, f"{why}: the published index stands"))
            return pool, None
        signals = replace(snapshot, entity_matches={})
        names = query_entity_names(query) if config.entities and fusion == "rrf" else []
        if names:
            ids = sorted({i for c in pool for i in c.memory_ids})
            signals.entity_matches = (
                entity_matches(db_path, ids, names, config.store_lock_timeout) or {}
            )
        live = [c for c in pool if not signals.dead.intersection(c.memory_ids)]
        detail = f"{len(pool) - len(live)} no longer active ({why})"
        stages.append(StageRun("liveness", True, detail, len(live)))
        return live, signals

    def _entity_stage(
        self,
        pool: list[Candidate],
        signals: StoreSignals | None,
        fusion: str,
        stages: list[StageRun],
    ) -> None:
        if not self.config.entities:
            stages.append(StageRun("entities", False, "off"))
            return
        if fusion != "rrf":
            stages.append(StageRun("entities", False, f"needs rank fusion (rrf), not {fusion}"))
            return
        if signals is None:
            stages.append(StageRun("entities", False, "store not read"))
            return
        for candidate in pool:
            candidate.entity_matches = max(
                (signals.entity_matches.get(i, 0) for i in candidate.memory_ids), default=0
            )
        positions = range(len(pool))
        entity = [p for p in positions if pool[p].entity_matches > 0]
        if not entity:
            stages.append(StageRun("entities", False, "no candidate names an entity of the query"))
            return
        rankings = [
            sorted(
                (p for p in positions if pool[p].hit.text_score > 0),
                key=lambda p: -pool[p].hit.text_score,
            ),
            sorted(positions, key=lambda p: -pool[p].hit.vector_score),
            sorted(entity, key=lambda p: -pool[p].entity_matches),
        ]
        rankings = [r for r in rankings if r]
        fused = rrf_scores(rankings)
        best = len(rankings) / (RRF_K + 1)
        for position, candidate in enumerate(pool):
            candidate.relevance = fused.get(position, 0.0) / best
        pool.sort(key=lambda c: -c.relevance)
        stages.append(StageRun("entities", True, f"{len(entity)} entity matches", len(pool)))

    def _rerank_stage(
        self, query: str, pool: list[Candidate], stages: list[StageRun]
    ) -> Literal["reranker", "fused"]:
        if not self.config.rerank:
            stages.append(StageRun("rerank", False, "off: relevance is the fused search score"))
            return "fused"
        if self.reranker is None:
            stages.append(
                StageRun("rerank", False, "no reranker model: relevance is the fused search score")
            )
            return "fused"
        scores = self.reranker.score(query, [c.text for c in pool])
        for candidate, score in zip(pool, scores, strict=True):
            candidate.relevance = float(score)
        pool.sort(key=lambda c: -c.relevance)
        stages.append(StageRun("rerank", True, self.reranker.model, len(pool)))
        return "reranker"

    def _threshold_stage(
        self, pool: list[Candidate], threshold: float | None, stages: list[StageRun]
    ) -> list[Candidate]:
        if not self.config.threshold:
            stages.append(StageRun("threshold", False, "off"))
            return pool
        cut = self.config.score_threshold if threshold is None else threshold
        kept = [c for c in pool if c.relevance >= cut]
        stages.append(StageRun("threshold", True, f"relevance >= {cut}", len(kept)))
        return kept

    def _recency_stage(self, pool: list[Candidate], now: datetime, stages: list[StageRun]) -> None:
        config = self.config
        if not config.recency:
            stages.append(StageRun("recency", False, "off"))
            return
        undated = 0
        for candidate in pool:
            when = candidate.hit.event_time
            if when is None:
                undated += 1  # notes without a date keep their relevance
                continue
            age = (now - when).total_seconds() / SECONDS_PER_DAY
            candidate.recency = recency_score(age, config.recency_scale_days)
            candidate.score = with_recency(
                candidate.relevance, candidate.recency, config.recency_weight
            )
        detail = f"w {config.recency_weight}, scale {config.recency_scale_days} d"
        stages.append(StageRun("recency", True, f"{detail}, {undated} undated", len(pool)))

    def _relations_stage(
        self, pool: list[Candidate], signals: StoreSignals | None, stages: list[StageRun]
    ) -> None:
        if not self.config.relations:
            stages.append(StageRun("relations", False, "off"))
            return
        if signals is None:
            stages.append(StageRun("relations", False, "store not read"))
            return
        linked = 0
        for candidate in pool:
            strengths = [signals.edges[i][0][1] for i in candidate.memory_ids if i in signals.edges]
            if strengths:
                candidate.relation_strength = max(strengths)
                candidate.score += self.config.relation_weight * candidate.relation_strength
                linked += 1
        detail = f"w {self.config.relation_weight}, {linked} linked"
        stages.append(StageRun("relations", True, detail, len(pool)))

    def _insight_stage(self, pool: list[Candidate], stages: list[StageRun]) -> None:
        if not self.config.insight:
            stages.append(StageRun("insight", False, "off"))
            return
        insights = [c for c in pool if c.hit.kind == "insight"]
        for candidate in insights:
            candidate.score *= self.config.insight_weight
        detail = f"x {self.config.insight_weight} for {len(insights)} insights"
        stages.append(StageRun("insight", True, detail, len(pool)))

    def _select(
        self, pool: list[Candidate], top_k: int, index: PublishedIndex, stages: list[StageRun]
    ) -> list[Candidate]:
        config = self.config
        ranked = sorted(pool, key=lambda c: -c.score)
        if not config.mmr:
            stages.append(StageRun("mmr", False, "off"))
            return ranked[:top_k]
        if not index.manifest["dims"]:
            stages.append(StageRun("mmr", False, "the index has no vectors"))
            return ranked[:top_k]
        vectors = np.asarray(index.vectors[[c.hit.row for c in ranked]], dtype=np.float64)
        scores = min_max(np.asarray([c.score for c in ranked]))
        items = [ranked[p] for p in mmr_order(scores, vectors, top_k, config.mmr_lambda)]
        stages.append(StageRun("mmr", True, f"lambda {config.mmr_lambda}", len(items)))
        return items
