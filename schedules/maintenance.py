"""Schedules of the pipeline; cron strings live in `schedules/crons.py`."""

from __future__ import annotations

import dagster as dg

from assets.jobs import ingest_job
from schedules.crons import CRONS, TIMEZONE

full_sync_schedule = dg.ScheduleDefinition(
    name="full_sync_schedule",
    job=ingest_job,
    cron_schedule=CRONS["full_sync"],
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Hourly full sync of the workspace (incremental: unchanged files are skipped).",
)

SCHEDULES = [full_sync_schedule]
