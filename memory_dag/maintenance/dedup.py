"""Dedup and merge, nightly at 03:30 (seed 003 §4); the pairs come from `dedup_pairs.py`.

Pairs judged in the last 14 days (`merge_fingerprints`) are skipped; a scope gets one pass a day
with at most 50 pairs, judged by the LLM in batches of 8 or by `reconcile.relate` (duplicate
or update -> same fact). A merge keeps the newer fact with the union of both provenances;
merged-away facts get `replaced_by` and no purge date: they are the survivor's provenance.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.llm import LLMClient, LLMError
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.maintenance.dedup_pairs import (
    Pair,
    _changed_times,
    _fill_vectors,
    _load_facts,
    candidate_pool,
    prefilter_pairs,
)
from memory_dag.memories.facts import validate_fact
from memory_dag.memories.reconcile import relate
from memory_dag.memories.writer import MemoryWriter
from memory_dag.reports import StageReport
from memory_dag.store.connection import fetch_dicts, listed, open_store


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
        valid = validate_fact(answer.text or "") if answer.same else None
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
    with listed(writer.con, "_pair_ids", ids):
        rows = {
            r["id"]: r
            for r in fetch_dicts(
                writer.con,
                f"SELECT {_MERGE_COLUMNS} FROM facts WHERE id IN (SELECT value FROM _pair_ids)",
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
    common.soft_delete_rows(
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
    report = common.new_report("dedup_merge")
    with common.timed(report):
        now = common.aware(now)
        provider = get_provider(settings)
        today = common.day_start(now)
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
        with common.maintenance_writer(settings, common.aware(now)) as writer:
            merged, checked = _apply_merges(writer, to_judge, verdicts, now)
            _remember_pairs(writer.con, checked, now)
            with listed(writer.con, "_merged", merged):
                report.preview = fetch_dicts(
                    writer.con,
                    "SELECT id, source_ids, content FROM memories "
                    "WHERE id IN (SELECT value FROM _merged) ORDER BY id LIMIT ?",
                    [common.PREVIEW_ROWS],
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
            common.refresh_index(settings, report)
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
    llm = common.llm_client(settings)
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
