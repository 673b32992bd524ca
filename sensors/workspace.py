"""The workspace sensor: the file watcher of seed 002, as a Dagster sensor.

It looks only at the filesystem (sensors run outside the DuckDB pool), keeps the file
state in its cursor, and asks for one ingest run per workspace version: the run key is a
fingerprint of every file's hash, so the same change never runs twice, even after a
cursor reset.
"""

import json
from pathlib import Path

import dagster as dg

from assets.jobs import ingest_job
from assets.resources import MemoryStoreResource
from memory_dag.ingest.watch import scan_workspace, state_fingerprint

#: Seed 002's watch debounce (1.5 s): files younger than this are looked at next time.
DEBOUNCE_SECONDS = 1.5


@dg.sensor(
    job=ingest_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Runs the ingest job when workspace notes or transcripts appear, change or go.",
)
def workspace_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryStoreResource
) -> dg.SensorResult:
    previous = json.loads(context.cursor) if context.cursor else {}
    settings = memory.settings()
    changes, state = scan_workspace(
        Path(settings.workspace),
        previous,
        debounce_seconds=DEBOUNCE_SECONDS,
        extra_roots=settings.workspace_extra_roots,
    )
    cursor = json.dumps(state, sort_keys=True)
    if not changes.any:
        reason = "no changes" + (f" ({changes.summary()})" if changes.settling else "")
        return dg.SensorResult(skip_reason=reason, cursor=cursor)
    request = dg.RunRequest(
        run_key=f"workspace-{state_fingerprint(state)}",
        tags={"memory_dag/changes": changes.summary()},
    )
    context.log.info(f"workspace changed: {changes.summary()}")
    return dg.SensorResult(run_requests=[request], cursor=cursor)


SENSORS = [workspace_sensor]
