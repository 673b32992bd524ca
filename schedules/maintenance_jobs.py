"""Schedules of the maintenance jobs (issue 5); cron strings live in `schedules/crons.py`.

Every request carries the tick's time as the job's clock (`as_of`) and a run key per tick, so
a tick never runs twice and a re-executed run does the same work. The weekly reflection
schedule adds two rules: it runs on Sundays only (a tick evaluated on another day, as from
the UI's "test schedule", is skipped), and not within 6 days of the last reflection run in
this Dagster instance (the library applies the same rule per scope against the store).
Schedules run outside the DuckDB pool, so they look only at the Dagster instance.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg

from assets.maintenance import (
    AS_OF_TAG,
    decay,
    dedup_merge,
    entity_enrichment,
    insights,
    lifecycle,
    reflection_job,
    session_consolidation,
    weekly_reflection,
)
from schedules.crons import CRONS, TIMEZONE

SUNDAY = 6
#: Runs that count as "a reflection ran": finished well, or on their way.
_LIVE_STATUSES = [
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
]


def tick_time(context: dg.ScheduleEvaluationContext) -> datetime:
    """The tick's scheduled time (now when evaluated by hand without one)."""
    return context.scheduled_execution_time or datetime.now(UTC)


def run_request(name: str, asset: dg.AssetsDefinition, when: datetime) -> dg.RunRequest:
    """One run per tick, its clock set to the tick."""
    as_of = when.isoformat()
    op_name = asset.op.name
    return dg.RunRequest(
        run_key=f"{name}-{as_of}",
        run_config={"ops": {op_name: {"config": {"as_of": as_of}}}},
        tags={AS_OF_TAG: as_of},
    )


def _every(
    name: str, job_name: str, asset: dg.AssetsDefinition, what: str
) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=f"{name}_schedule",
        cron_schedule=CRONS[name],
        job_name=job_name,
        execution_timezone=TIMEZONE,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"{what} ({CRONS[name]}, {TIMEZONE}).",
    )
    def _schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return run_request(name, asset, tick_time(context))

    return _schedule


entity_enrichment_schedule = _every(
    "entity_enrichment", "entity_enrichment_job", entity_enrichment, "Entity enrichment"
)
session_consolidation_schedule = _every(
    "session_consolidation",
    "session_consolidation_job",
    session_consolidation,
    "Consolidation of every pending session",
)
dedup_merge_schedule = _every("dedup_merge", "dedup_merge_job", dedup_merge, "Dedup / merge worker")
decay_schedule = _every("decay", "decay_job", decay, "Confidence decay")
lifecycle_schedule = _every("lifecycle", "lifecycle_job", lifecycle, "TTL, purge and eviction")
insights_schedule = _every("insights", "insights_job", insights, "Background insights")


def last_reflection_run(instance: dg.DagsterInstance, before: datetime) -> datetime | None:
    """The clock of the latest live reflection run at or before `before` (manual runs count
    from their creation time)."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(job_name=reflection_job.name, statuses=_LIVE_STATUSES), limit=20
    )
    times = []
    for record in records:
        tag = record.dagster_run.tags.get(AS_OF_TAG)
        moment = (
            datetime.fromisoformat(tag)
            if tag
            else datetime.fromtimestamp(record.create_timestamp.timestamp(), UTC)
        )
        if moment <= before:
            times.append(moment)
    return max(times, default=None)


@dg.schedule(
    name="weekly_reflection_schedule",
    cron_schedule=CRONS["weekly_reflection"],
    job=reflection_job,
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description=(
        f"Weekly reflection ({CRONS['weekly_reflection']}, {TIMEZONE}): Sundays only, at most "
        "once per 6 days."
    ),
)
def weekly_reflection_schedule(
    context: dg.ScheduleEvaluationContext,
) -> dg.RunRequest | dg.SkipReason:
    when = tick_time(context)
    if when.weekday() != SUNDAY:
        return dg.SkipReason(f"reflections run on Sundays; {when:%A %Y-%m-%d} is not one")
    from memory_dag.maintenance.common import DEFAULT_CONFIG  # the library: at a tick, not import

    last = last_reflection_run(context.instance, when)
    if last is not None and when - last < timedelta(days=DEFAULT_CONFIG.reflection_min_days):
        return dg.SkipReason(f"the last reflection ran {last:%Y-%m-%d %H:%M}, under 6 days ago")
    return run_request("weekly_reflection", weekly_reflection, when)


MAINTENANCE_SCHEDULES = [
    entity_enrichment_schedule,
    session_consolidation_schedule,
    dedup_merge_schedule,
    decay_schedule,
    lifecycle_schedule,
    weekly_reflection_schedule,
    insights_schedule,
]
