"""The asset graph of a sharded store (MEMORY_DAG_SHARDS > 1): the same assets, partitioned.

With one shard nothing here is used: `memory_dag/definitions.py` keeps today's graph. With N
shards every asset gets a `StaticPartitionsDefinition` of the shards (`shard-00` …), in place
of the summaries' partition per conversation; the resource `ShardedMemoryStore` reads the
run's partition and hands every asset that shard's settings, so no asset changes. A shard's
ingest run summarizes the shard's conversations whose input changed (the summaries step of a
run without conversation partitions), so summaries work inside a shard as before.

One writer per shard, many shards at once: every run carries the tag `memory-dag/shard`, and
the instance's run queue allows one run per value of it (`tag_concurrency_limits` with
`applyLimitPerUniqueValue`, deploy/local/dagster.yaml). Dagster's pools are fixed per step
definition, not per partition, so the `duckdb` pool cannot be per shard: the sharded instance
sets its limit to the number of workers and the per-shard tag limit keeps one writer a shard.
Schedules fan out one run per shard; the shard sensor, which replaces the single store's
sensors, routes the workspace and asks for a run of each shard whose files changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from assets.jobs import ingest_job
from assets.resources import MemoryStoreResource
from memory_dag.config import Settings
from memory_dag.ingest.sensor_state import load_state, save_state, state_folder
from memory_dag.ingest.watch import state_fingerprint
from memory_dag.store.shards import (
    SHARD_TAG,
    shard_count,
    shard_key,
    shard_number,
    shard_settings,
)
from sensors.workspace import DEBOUNCE_SECONDS, INTERVAL_SECONDS

PARTITION_TAG = "dagster/partition"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def shard_partitions(shards: int) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition([shard_key(shard) for shard in range(shards)])


class ShardedMemoryStore(MemoryStoreResource):
    """`MemoryStoreResource` whose settings are those of the run's shard.

    The shard comes from the run's partition (`shard-03`). Outside a run (sensors), the whole
    store's settings. A run over a range of shards is refused: one run, one writer, one shard.
    """

    _partition: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.run
        tags = run.tags if run is not None else {}
        if RANGE_START_TAG in tags and tags[RANGE_START_TAG] != tags.get(RANGE_END_TAG):
            raise dg.DagsterInvariantViolationError(
                "a run of a sharded store covers one shard, not a range (one writer per shard)"
            )
        self._partition = tags.get(PARTITION_TAG) or tags.get(RANGE_START_TAG)

    def settings(self) -> Settings:
        base = super().settings()
        if self._partition is None:
            return base
        return shard_settings(base, shard_number(self._partition), shard_count(base))


def partitioned(
    assets: Sequence[dg.AssetsDefinition], partitions: dg.PartitionsDefinition
) -> list[dg.AssetsDefinition]:
    """The same assets, every one partitioned by shard; a backfill runs one shard a run."""

    def by_shard(spec: dg.AssetSpec) -> dg.AssetSpec:
        return spec.replace_attributes(partitions_def=partitions)

    unique = {id(asset): asset for asset in assets}.values()  # a list may name one twice
    return [
        asset.map_asset_specs(by_shard).with_attributes(
            backfill_policy=dg.BackfillPolicy.multi_run(1)
        )
        for asset in unique
    ]


def by_shard_jobs(jobs: Sequence[Any]) -> list[Any]:
    """The same jobs; one that named its own partitions (conversations) takes the shards'."""
    return [
        dg.define_asset_job(
            job.name,
            selection=job.selection,
            config=job.config,
            description=job.description,
            tags=job.tags,
        )
        if getattr(job, "partitions_def", None) is not None and hasattr(job, "selection")
        else job
        for job in jobs
    ]


def shard_request(request: dg.RunRequest, shard: str) -> dg.RunRequest:
    """`request` for one shard: its partition, its tag, its own run key."""
    run_key = f"{request.run_key}:{shard}" if request.run_key else None
    tags = {**request.tags, SHARD_TAG: shard}
    return request.with_replaced_attrs(run_key=run_key, partition_key=shard, tags=tags)


def fan_out_schedule(schedule: dg.ScheduleDefinition, shards: int) -> dg.ScheduleDefinition:
    """The same schedule (name, cron, job), asking for one run per shard per tick."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> Iterator[dg.RunRequest | dg.SkipReason]:
        data = schedule.evaluate_tick(context)
        if not data.run_requests:
            yield dg.SkipReason(data.skip_message or "nothing to run")
        tick = context.scheduled_execution_time or datetime.now(UTC)
        for request in data.run_requests or []:
            if request.run_key is None:  # several requests a tick: each needs a run key
                request = request.with_replaced_attrs(run_key=f"{schedule.name}-{tick.isoformat()}")
            for shard in range(shards):
                yield shard_request(request, shard_key(shard))

    return dg.ScheduleDefinition(
        name=schedule.name,
        cron_schedule=schedule.cron_schedule,
        job_name=schedule.job_name,
        execution_fn=evaluate,
        execution_timezone=schedule.execution_timezone,
        default_status=schedule.default_status,
        description=f"{schedule.description or ''} One run per shard.".strip(),
    )


@dg.sensor(
    job_name=ingest_job.name,
    minimum_interval_seconds=INTERVAL_SECONDS,  # every pass of the daemon (5 s), not every other
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Routes workspace files to their shards; one ingest run per shard that changed.",
)
def shard_workspace_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryStoreResource
) -> dg.SensorResult:
    """Filesystem only (never DuckDB): route, then watch each shard's workspace like
    `workspace_sensor` watches the one workspace; the run key is shard + its files' version.
    The shards with the most changed bytes are asked for first (`ShardLook.changed_shards`)."""
    # Imported here: routing reads files, which the code server never needs at load time.
    from memory_dag.ingest.routing import look_at_shards

    settings = memory.settings()
    folder = state_folder(settings)
    previous = load_state(folder, "shard_workspace_sensor", context.cursor)
    look = look_at_shards(settings, previous, debounce_seconds=DEBOUNCE_SECONDS)
    requests = [
        dg.RunRequest(
            run_key=f"{key}-{state_fingerprint(look.shards[key].state)}",
            partition_key=key,
            tags={SHARD_TAG: key, "memory_dag/changes": look.shards[key].changes.summary()},
        )
        for key in look.changed_shards()
    ]
    if requests:
        context.log.info(f"shards changed: {', '.join(r.partition_key or '' for r in requests)}")
    skip_reason = "no shard changed" if look.routed else "the workspace is unchanged"
    return dg.SensorResult(
        run_requests=requests,
        cursor=save_state(folder, "shard_workspace_sensor", look.cursor, context.cursor),
        skip_reason=None if requests else skip_reason,
    )


def sharded_definitions(defs: dg.Definitions, shards: int) -> dg.Definitions:
    """The single-store code location, partitioned by shard (see the module docstring)."""
    base = defs.resources["memory"] if defs.resources else MemoryStoreResource()
    fields = base.model_dump() if isinstance(base, MemoryStoreResource) else {}
    return dg.Definitions(
        assets=partitioned(list(defs.assets or []), shard_partitions(shards)),
        asset_checks=defs.asset_checks,
        jobs=by_shard_jobs(list(defs.jobs or [])),
        sensors=[shard_workspace_sensor],
        schedules=[fan_out_schedule(schedule, shards) for schedule in defs.schedules or []],
        resources={**(defs.resources or {}), "memory": ShardedMemoryStore(**fields)},
        executor=defs.executor,
    )


def configured_shards() -> int:
    """The shard count of the store the environment names (reads a small JSON file, no DuckDB)."""
    return shard_count(Settings.load())
