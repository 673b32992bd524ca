"""What every nightly job shares: thresholds (`MaintenanceConfig`), the job's report and clock,
a writer transaction, and bulk soft deletes at the job's clock. Jobs group memories by owner
(`memory_dag/scope.py`: `OWNER_SQL`, `owner_of`): the user when there is one, else the
conversation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.llm import LLMClient, LLMConfig
from memory_dag.memories.writer import MemoryWriter
from memory_dag.reports import StageReport
from memory_dag.store.connection import listed, open_store

ACTOR = "maintenance"
#: Every report holds these counts (0 when a job does not do that kind of change).
REPORT_COUNTS = ("examined", "merged", "decayed", "soft_deleted", "purged", "created")
PREVIEW_ROWS = 10

ACTIVE_SQL = "valid_until IS NULL AND state = 'active'"


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


def new_report(job: str) -> StageReport:
    return StageReport(job, counts=dict.fromkeys(REPORT_COUNTS, 0))


@contextmanager
def timed(report: StageReport) -> Iterator[StageReport]:
    started = time.perf_counter()
    try:
        yield report
    finally:
        report.seconds = round(time.perf_counter() - started, 3)


@contextmanager
def maintenance_writer(settings: Settings, now: datetime | None = None) -> Iterator[MemoryWriter]:
    """A short connection with one writer transaction (all or nothing), stamping rows at the
    job's clock `now`."""
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=ACTOR, now=now)
        with writer.transaction():
            yield writer


def llm_client(settings: Settings) -> LLMClient | None:
    config = LLMConfig.from_settings(settings)
    return LLMClient(config) if config is not None else None


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def day_start(now: datetime) -> datetime:
    """Midnight of `now`'s day, in `now`'s timezone: the unit of 'the same day'."""
    now = aware(now)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def refresh_index(settings: Settings, report: StageReport) -> None:
    """Embed what is missing and republish the index, so the change is searchable (or gone)."""
    from memory_dag.index.build import refresh_search_index  # FAISS: when a job republishes

    index = refresh_search_index(settings, incremental=False)[-1]
    report.counts["index_rows"] = int(index.counts.get("rows", 0))
    report.notes.append("search index republished" if not index.skipped else "index unchanged")


def unlink_entities(con: Any, memory_ids: list[str]) -> int:
    """Remove the memories' entity links; the entities' mention counts follow."""
    if not memory_ids:
        return 0
    with listed(con, "_unlinked", memory_ids):
        con.execute(
            "UPDATE entities SET mention_count = entities.mention_count - gone.n "
            "FROM (SELECT entity_id, count(*) AS n FROM memory_entities "
            "      WHERE memory_id IN (SELECT value FROM _unlinked) GROUP BY entity_id) gone "
            "WHERE entities.id = gone.entity_id"
        )
        row = con.execute(
            "DELETE FROM memory_entities WHERE memory_id IN (SELECT value FROM _unlinked)"
        ).fetchone()
    return int(row[0]) if row else 0


def soft_delete_rows(
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
    with listed(writer.con, "_deleted_ids", ids):
        links = dict(
            writer.con.execute(
                "SELECT memory_id, list(entity_id ORDER BY entity_id) FROM memory_entities "
                "WHERE memory_id IN (SELECT value FROM _deleted_ids) GROUP BY memory_id"
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
    unlink_entities(writer.con, ids)
    for row in rows:
        details = {"text": row["content"], "entity_ids": links.get(row["id"], []), **meta(row)}
        if purge_at is not None:
            details["purge_at"] = purge_at.isoformat()
        writer.history(
            row["id"], event, old_ref=row["id"], new_ref=row.get("replaced_by"), meta=details
        )
        if change is not None:
            writer.log_change(row["conversation_id"], row["id"], change, {"job": event.lower()})


def rows_by_scope(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["scope"], []).append(row)
    return grouped
