"""Lifecycle, nightly at 04:30 (seed 003 §7, seed 000 §4.5, §10): purge, TTL, eviction, and the
expiry of consent proposals nobody decided within their hold (history EXPIRE).

* `lifecycle`: purge of what was due (`purge_at`) before the day began; TTL (not accessed since
  60 days before the day began, importance < 3, not pinned, decay_rate > 0) -> soft-deleted
  with `purge_at` = +30 days; eviction of the oldest facts and turns of a conversation above
  500 active memories (summaries and pinned memories exempt).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from memory_dag.config import Settings
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.memories.consent import expire_proposals
from memory_dag.memories.writer import MemoryWriter
from memory_dag.reports import StageReport
from memory_dag.store.connection import fetch_dicts, listed


def lifecycle(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Purge what is past `purge_at`, then TTL (seed 003 §7) and eviction (seed 000 §4.5)."""
    report = common.new_report("lifecycle")
    with common.timed(report):
        now = common.aware(now)
        today = common.day_start(
            now
        )  # cutoffs move once a day: a second run the same day is a no-op
        with common.maintenance_writer(settings, common.aware(now)) as writer:
            con = writer.con
            purged = _purge(writer, today)
            proposals_expired = expire_proposals(writer, now)
            expired = fetch_dicts(
                con,
                f"""
                SELECT id, content, conversation_id, importance,
                       coalesce(last_accessed, created_at) AS last_seen
                FROM memories
                WHERE {common.ACTIVE_SQL} AND NOT pinned AND decay_rate > 0 AND importance < ?
                  AND coalesce(last_accessed, created_at) <= ?
                ORDER BY id
                """,
                [config.ttl_importance_below, today - timedelta(days=config.ttl_days)],
            )
            common.soft_delete_rows(
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
                          FROM memories WHERE {common.ACTIVE_SQL} AND conversation_id IS NOT NULL)
                )
                WHERE evictable AND n <= total - ?
                ORDER BY conversation_id, n
                """,
                [config.max_entries],
            )
            common.soft_delete_rows(
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
                for r in rows[: common.PREVIEW_ROWS]
            ]
        report.counts.update(
            examined=len(expired) + len(evicted) + purged,
            soft_deleted=len(expired) + len(evicted),
            purged=purged,
            expired=len(expired),
            evicted=len(evicted),
            proposals_expired=proposals_expired,
        )
        if expired or evicted or purged:
            common.refresh_index(settings, report)
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
        common.unlink_entities(con, ids)
        with listed(con, "_purged", ids):
            con.execute(
                "DELETE FROM relations WHERE from_id IN (SELECT value FROM _purged) "
                "OR to_id IN (SELECT value FROM _purged)"
            )
            con.execute("DELETE FROM memories WHERE id IN (SELECT value FROM _purged)")
    return len(ids)
