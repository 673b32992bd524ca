"""Schedules of the pipeline; cron strings live in `schedules/crons.py`."""

from __future__ import annotations

from assets.jobs import ingest_job
from schedules.crons import cron_schedule

full_sync_schedule = cron_schedule(
    "full_sync",
    ingest_job,
    "Hourly full sync of the workspace (incremental: unchanged files are skipped).",
)

SCHEDULES = [full_sync_schedule]
