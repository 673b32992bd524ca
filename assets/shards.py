"""The asset graph of a sharded store (MEMORY_DAG_SHARDS > 1): the same assets, partitioned.

With one shard nothing here is used: `memory_dag/definitions.py` keeps today's graph. With N
shards the ingest, write-path, index, maintenance and read assets get a
`StaticPartitionsDefinition` of the shards (`shard-00` …); the resource `ShardedMemoryStore`
reads the run's partition and hands every asset that shard's settings, so no asset changes.
Summaries keep their partition per conversation and run in the conversation's shard.

One writer per shard, many shards at once: every run carries the tag `memory-dag/shard`, and
the instance's run queue allows one run per value of it (`tag_concurrency_limits` with
`applyLimitPerUniqueValue`, deploy/local/dagster.yaml). Dagster's pools are fixed per step
definition, not per partition, so the `duckdb` pool cannot be per shard: the sharded instance
sets its limit to the number of workers and the per-shard tag limit keeps one writer a shard.
Schedules fan out one run per shard; the shard sensor routes the workspace and asks for a run
of each shard whose files changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from assets.jobs import ingest_job
from assets.resources import MemoryStoreResource
from memory_dag.config import Settings
from memory_dag.ingest.watch import scan_workspace, state_fingerprint
from memory_dag.store.shards import (
    SHARD_TAG,
    read_routes,
    route_key,
    shard_count,
    shard_key,
    shard_number,
    shard_of,
    shard_settings,
)

PARTITION_TAG = "dagster/partition"


def shard_partitions(shards: int) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition([shard_key(shard) for shard in range(shards)])


class ShardedMemoryStore(MemoryStoreResource):
    """`MemoryStoreResource` whose settings are those of the run's shard.

    The shard comes from the run's partition: a shard key (`shard-03`), or a conversation
    (summaries), routed by `routes.json`. Outside a run (sensors), the whole store's settings.
    """

    _partition: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.dagster_run
        self._partition = run.tags.get(PARTITION_TAG) if run is not None else None

    def settings(self) -> Settings:
        base = super().settings()
        if self._partition is None:
            return base
        return shard_settings(base, shard_for_partition(base, self._partition), shard_count(base))


def shard_for_partition(settings: Settings, partition: str) -> int:
    """The shard of a partition key: a shard key, or a conversation (routed like its rows)."""
    if partition.startswith("shard-"):
        return shard_number(partition)
    key = route_key(None, partition, read_routes(settings))
    return shard_of(str(key), shard_count(settings))


def partitioned(
    assets: Sequence[dg.AssetsDefinition], partitions: dg.PartitionsDefinition
) -> list[dg.AssetsDefinition]:
    """The same assets, partitioned (assets that already have partitions keep theirs). A
    dependency between a shard and a conversation partition maps to all partitions: a
    conversation's summary reads its shard's files, whichever runs first."""
    own = {spec.key for asset in assets for spec in asset.specs if spec.partitions_def is not None}

    def add(spec: dg.AssetSpec) -> dg.AssetSpec:
        mine = spec.key in own
        deps = [
            dg.AssetDep(dep.asset_key, partition_mapping=dg.AllPartitionMapping())
            if (dep.asset_key in own) != mine
            else dep
            for dep in spec.deps
        ]
        if mine:
            return spec.replace_attributes(deps=deps)
        return spec.replace_attributes(partitions_def=partitions, deps=deps)

    return [asset.map_asset_specs(add) for asset in assets]


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


def shard_tagged_sensor(
    sensor: dg.SensorDefinition, settings_of: Callable[[], Settings], *, fan_out: bool
) -> dg.SensorDefinition:
    """The same sensor; its runs carry the shard tag of their partition (a conversation's
    shard), or, with `fan_out`, are asked once per shard (jobs over shard-partitioned assets)."""

    def evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        data = sensor.evaluate_tick(context)
        settings = settings_of()
        shards = shard_count(settings)
        requests = []
        for request in data.run_requests or []:
            if fan_out and request.partition_key is None:
                requests += [shard_request(request, shard_key(s)) for s in range(shards)]
            else:
                shard = shard_key(shard_for_partition(settings, str(request.partition_key)))
                requests.append(
                    request.with_replaced_attrs(tags={**request.tags, SHARD_TAG: shard})
                )
        return dg.SensorResult(
            run_requests=requests,
            cursor=data.cursor,
            dynamic_partitions_requests=data.dynamic_partitions_requests,
            skip_reason=None if requests else (data.skip_message or "nothing to run"),
        )

    return dg.SensorDefinition(
        name=sensor.name,
        evaluation_fn=evaluate,
        minimum_interval_seconds=sensor.minimum_interval_seconds,
        description=sensor.description,
        job_name=sensor.job_name,
        default_status=sensor.default_status,
        required_resource_keys={"memory"},
    )


#: Files younger than this are being written: looked at next time (seed 002's debounce).
DEBOUNCE_SECONDS = 1.5


@dg.sensor(
    job_name=ingest_job.name,
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Routes workspace files to their shards; one ingest run per shard that changed.",
)
def shard_workspace_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryStoreResource
) -> dg.SensorResult:
    """Filesystem only (never DuckDB): route, then watch each shard's workspace like
    `workspace_sensor` watches the one workspace; the run key is shard + its files' version."""
    # Imported here: routing reads files, which the code server never needs at load time.
    from memory_dag.ingest.routing import route_workspace
    from memory_dag.store.shards import all_shard_settings

    settings = memory.settings()
    route_workspace(settings)
    previous = json.loads(context.cursor) if context.cursor else {}
    cursor: dict[str, Any] = {}
    requests = []
    for number, shard in enumerate(all_shard_settings(settings)):
        key = shard_key(number)
        changes, state = scan_workspace(
            Path(shard.workspace),
            previous.get(key, {}),
            debounce_seconds=DEBOUNCE_SECONDS,
            extra_roots=shard.workspace_extra_roots,
        )
        cursor[key] = state
        if changes.any:
            requests.append(
                dg.RunRequest(
                    run_key=f"{key}-{state_fingerprint(state)}",
                    partition_key=key,
                    tags={SHARD_TAG: key, "memory_dag/changes": changes.summary()},
                )
            )
    if requests:
        context.log.info(f"shards changed: {', '.join(r.partition_key or '' for r in requests)}")
    return dg.SensorResult(
        run_requests=requests,
        cursor=json.dumps(cursor, sort_keys=True),
        skip_reason=None if requests else "no shard changed",
    )


#: Sensors the shard sensor replaces (they watch the one workspace of the single store).
REPLACED_SENSORS = ("workspace_sensor", "sessions_sensor")


def sharded_definitions(defs: dg.Definitions, shards: int) -> dg.Definitions:
    """The single-store code location, partitioned by shard (see the module docstring)."""
    partitions = shard_partitions(shards)
    base = defs.resources["memory"] if defs.resources else MemoryStoreResource()
    memory = (
        ShardedMemoryStore(**base.model_dump())
        if isinstance(base, MemoryStoreResource)
        else (ShardedMemoryStore())
    )

    def settings_of() -> Settings:
        return memory.settings()

    sensors = [shard_workspace_sensor]
    for sensor in defs.sensors or []:
        if sensor.name in REPLACED_SENSORS:
            continue
        fan_out = sensor.job_name != "summaries_job"  # summaries: a partition per conversation
        sensors.append(shard_tagged_sensor(sensor, settings_of, fan_out=fan_out))
    return dg.Definitions(
        assets=partitioned(list(defs.assets or []), partitions),
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        sensors=sensors,
        schedules=[fan_out_schedule(schedule, shards) for schedule in defs.schedules or []],
        resources={**(defs.resources or {}), "memory": memory},
        executor=defs.executor,
    )


def configured_shards() -> int:
    """The shard count of the store the environment names (reads a small JSON file, no DuckDB)."""
    return shard_count(Settings.load())
