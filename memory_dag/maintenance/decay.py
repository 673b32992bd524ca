"""Decay, nightly at 04:00 (seed 004).

* `decay`: `confidence × exp(−decay_rate × days)` since the later of the last access (or
  creation) and the last decay, counted to the start of `now`'s day; below 0.05 the memory is
  soft-deleted (purge in 30 days) and its entity links removed. `decay_rate = 0` never decays.

Decay is idempotent by construction: each memory carries `attributes.decayed_at`, the day
boundary its confidence was last decayed to, and a run decays only the time since then (or
since a later access). Decaying in one step or in many gives the same confidence.
Confidence-only decay leaves one job-level `DECAY` history row (memory_id NULL) with the
counts and the day, not one row per memory per night.
"""

from __future__ import annotations

from datetime import datetime

from memory_dag.config import Settings
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.reports import StageReport
from memory_dag.store.connection import fetch_dicts


def decay(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 004 Ebbinghaus decay, idempotent per day (see the module docstring)."""
    report = common.new_report("decay")
    with common.timed(report):
        as_of = common.day_start(now)
        with common.maintenance_writer(settings, common.aware(now)) as writer:
            con = writer.con
            examined = con.execute(
                f"SELECT count(*) FROM memories WHERE {common.ACTIVE_SQL} AND decay_rate > 0"
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
                    FROM memories WHERE {common.ACTIVE_SQL} AND decay_rate > 0
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
            common.soft_delete_rows(
                writer,
                below,
                event="DECAY",
                now=common.aware(now),
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
        report.preview = report.preview[: common.PREVIEW_ROWS]
        report.counts.update(examined=int(examined), decayed=int(decayed), soft_deleted=len(below))
        report.notes.append(f"decayed to {as_of.isoformat()}, threshold {config.decay_threshold}")
        if below:
            common.refresh_index(settings, report)
    return report
