"""The workspace sensor: the file watcher of seed 002, as a Dagster sensor.

It looks only at the filesystem and the Dagster instance (sensors run outside the DuckDB
pool), keeps the file state beside the store (`ingest/sensor_state.py`; the cursor names that
file), and asks for one ingest run per workspace version: the run key is a fingerprint of
every file's hash, so the same change never runs twice, even after a cursor reset. The run
summarizes only the conversations whose files changed (`assets.jobs.ingest_run`); new
conversations become summary partitions in the same tick.
"""

from pathlib import Path

import dagster as dg

from assets.jobs import ingest_job, ingest_run
from assets.resources import MemoryStoreResource
from assets.summaries import conversations
from memory_dag.ingest.sensor_state import load_state, save_state, state_folder
from memory_dag.ingest.watch import changed_conversations, scan_settled, state_fingerprint

#: Seed 002's watch debounce (1.5 s): files younger than this are looked at next time.
DEBOUNCE_SECONDS = 1.5
#: How often the daemon looks (a stat of every workspace file; hashes only of changed ones):
#: at each pass of Dagster's sensor daemon, which comes every 5 s. Not 5 itself: the daemon
#: skips a sensor whose last tick is less than its interval old, and a pass that comes round
#: a few milliseconds early finds it 4.99 s old, so an interval of 5 s means 10 s as often as
#: not (measured: the shard sensor's ticks at 9.6, 19.6, 24.6, 29.6, 39.6 s after files came).
INTERVAL_SECONDS = 1


@dg.sensor(
    job=ingest_job,
    minimum_interval_seconds=INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Runs the ingest job when workspace notes or transcripts appear, change or go.",
)
def workspace_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryStoreResource
) -> dg.SensorResult:
    settings = memory.settings()
    folder = state_folder(settings)
    previous = load_state(folder, "workspace_sensor", context.cursor)

    changes, state = scan_settled(
        Path(settings.workspace),
        previous,
        debounce_seconds=DEBOUNCE_SECONDS,
        extra_roots=settings.workspace_extra_roots,
    )
    cursor = save_state(folder, "workspace_sensor", state, context.cursor)
    if not changes.any:
        reason = "no changes" + (f" ({changes.summary()})" if changes.settling else "")
        return dg.SensorResult(skip_reason=reason, cursor=cursor)
    run = ingest_run(
        context.instance.get_dynamic_partitions(conversations.name), changed_conversations(changes)
    )
    request = dg.RunRequest(
        run_key=f"workspace-{state_fingerprint(state)}",
        tags={**run.tags, "memory_dag/changes": changes.summary()},
        asset_selection=run.asset_selection,
    )
    context.log.info(f"workspace changed: {changes.summary()}")
    return dg.SensorResult(
        run_requests=[request],
        cursor=cursor,
        dynamic_partitions_requests=(
            [conversations.build_add_request(run.new_partitions)] if run.new_partitions else []
        ),
    )


SENSORS = [workspace_sensor]
