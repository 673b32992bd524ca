"""Every cron string of the project, in one place. Times are in `TIMEZONE`."""

from __future__ import annotations

import os

import dagster as dg

#: IANA timezone of all schedules; set MEMORY_DAG_TIMEZONE to change it.
TIMEZONE = os.environ.get("MEMORY_DAG_TIMEZONE", "UTC")

CRONS: dict[str, str] = {
    # Periodic full sync of the workspace (the sensor handles changes between syncs).
    "full_sync": "0 * * * *",
    # Nightly maintenance (issue 5; seed 004, seed 003 §3, §4, §7).
    "entity_enrichment": "0 2 * * *",
    "session_consolidation": "0 3 * * *",
    "dedup_merge": "30 3 * * *",
    "decay": "0 4 * * *",
    "lifecycle": "30 4 * * *",
    "weekly_reflection": "0 3 * * 0",  # Sundays
    # Background insights: every 4 hours; each scope gets at most one run per 24 h.
    "insights": "45 */4 * * *",
    # Retrieval quality on the configured evaluation set, after the night's maintenance.
    "retrieval_evaluation": "0 5 * * *",
    # Access counts queued by reads, applied before the night's decay and TTL read them.
    "memory_access": "50 * * * *",
}


def cron_schedule(
    name: str, job: dg.UnresolvedAssetJobDefinition, description: str
) -> dg.ScheduleDefinition:
    """`<name>_schedule`: `job` at `CRONS[name]` in `TIMEZONE`, running from the start."""
    return dg.ScheduleDefinition(
        name=f"{name}_schedule",
        job=job,
        cron_schedule=CRONS[name],
        execution_timezone=TIMEZONE,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=description,
    )
