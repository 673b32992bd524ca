"""The sessions sensor: a new session closes the older ones, so their facts are consolidated.

Filesystem and Dagster instance only (sensors never open DuckDB). It keeps the session files it
has seen beside the store (`ingest/sensor_state.py`; the cursor names that file) and asks for
one `ingest_job` run when a conversation gains a session, or when an older (already closed)
session's transcript changes; the run summarizes those conversations. The run key is a
fingerprint of those conversations' transcripts, so the same change never runs twice, even
after a cursor reset.
"""

from pathlib import Path

import dagster as dg

from assets.jobs import ingest_job, ingest_run
from assets.resources import MemoryStoreResource
from assets.summaries import conversations
from memory_dag.ingest.sensor_state import load_state, save_state, state_folder
from memory_dag.memories.sessions import scan_sessions, sessions_fingerprint

#: Files younger than this are being written: looked at next time (seed 002's debounce).
DEBOUNCE_SECONDS = 1.5


@dg.sensor(
    job=ingest_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Consolidates closed sessions into facts when a conversation starts a new one.",
)
def sessions_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryStoreResource
) -> dg.SensorResult:
    settings = memory.settings()
    folder = state_folder(settings)
    previous = load_state(folder, "sessions_sensor", context.cursor)
    workspace = Path(settings.workspace)
    changes, state = scan_sessions(workspace, previous, debounce_seconds=DEBOUNCE_SECONDS)
    cursor = save_state(folder, "sessions_sensor", state, context.cursor)
    if not changes.conversations:
        return dg.SensorResult(
            skip_reason=f"no session closed ({changes.summary()})", cursor=cursor
        )
    run = ingest_run(
        context.instance.get_dynamic_partitions(conversations.name), changes.conversations
    )
    request = dg.RunRequest(
        run_key=f"sessions-{sessions_fingerprint(state, changes.conversations)}",
        tags={
            **run.tags,
            "memory_dag/conversations": ", ".join(changes.conversations)[:200],
            "memory_dag/changes": changes.summary(),
        },
        asset_selection=run.asset_selection,
    )
    context.log.info(f"sessions changed in {len(changes.conversations)} conversations")
    return dg.SensorResult(
        run_requests=[request],
        cursor=cursor,
        dynamic_partitions_requests=(
            [conversations.build_add_request(run.new_partitions)] if run.new_partitions else []
        ),
    )


SENSORS = [sessions_sensor]
