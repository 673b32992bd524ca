"""Conversation sensors: one partition per conversation, a summary run when one changes.

`conversations_sensor` looks only at the filesystem and the Dagster instance (never DuckDB).
A conversation is a `sessions/<conversation>/` folder of transcripts or an
`entries/<conversation>/` folder (its `summaries/` are our own output and do not count). New
conversations become partitions at once. A changed conversation is summarized only after an
ingest run that started after the change was seen, because the summary reads the turns from
the store: asking earlier would summarize the old turns and, the run key being used up,
never the new ones. The run key is conversation + content fingerprint, so one version of a
conversation is summarized once, even after a cursor reset.

`summaries_indexed_sensor` embeds and indexes summaries after they are written, from any run
(sensor, UI click, backfill), so searches with kind="summary" find them.
"""

import hashlib
import json
import time
from pathlib import Path

import dagster as dg

from assets.ingest import workspace_files
from assets.resources import MemoryStoreResource
from assets.summaries import conversation_summaries, conversations, summaries_job, summary_index_job
from memory_dag.ingest.watch import FileState, scan_workspace
from sensors.workspace import DEBOUNCE_SECONDS


def conversation_of(rel_path: str) -> str | None:
    """The conversation a workspace file belongs to, or None (notes, our summaries)."""
    parts = rel_path.split("/")
    if parts[0] == "sessions" and len(parts) >= 3:
        return "/".join(parts[1:-1])
    if parts[0] == "entries" and len(parts) >= 3 and parts[2] not in ("summaries", "deleted"):
        return parts[1]
    return None


def conversation_fingerprints(files: FileState) -> dict[str, str]:
    """conversation → hash over its files' paths and content hashes."""
    members: dict[str, list[str]] = {}
    for rel_path in sorted(files):
        conversation = conversation_of(rel_path)
        if conversation is None or "..." in conversation:  # "..." is not a valid partition key
            continue
        members.setdefault(conversation, []).append(f"{rel_path}\x00{files[rel_path][2]}")
    return {
        conversation: hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]
        for conversation, lines in members.items()
    }


def last_ingest_start(instance: dg.DagsterInstance) -> float | None:
    """When the run that last materialized `workspace_files` started (epoch seconds)."""
    event = instance.get_latest_materialization_event(workspace_files.key)
    if event is None:
        return None
    record = instance.get_run_record_by_id(event.run_id)
    if record is None or record.start_time is None:
        return event.timestamp
    return record.start_time


@dg.sensor(
    job=summaries_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Adds a partition per conversation; summarizes conversations that changed.",
)
def conversations_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryStoreResource
) -> dg.SensorResult:
    cursor = json.loads(context.cursor) if context.cursor else {}
    workspace = Path(memory.settings().workspace)
    _, files = scan_workspace(workspace, cursor.get("files", {}), debounce_seconds=DEBOUNCE_SECONDS)
    fingerprints = conversation_fingerprints(files)

    known = set(context.instance.get_dynamic_partitions(conversations.name))
    new_partitions = sorted(set(fingerprints) - known)
    # requested: the version last asked for; pending: [version, when first seen] not yet asked.
    requested = {c: v for c, v in cursor.get("requested", {}).items() if c in fingerprints}
    pending = {c: p for c, p in cursor.get("pending", {}).items() if c in fingerprints}
    now = time.time()
    for conversation, version in fingerprints.items():
        if requested.get(conversation) != version and pending.get(conversation, [""])[0] != version:
            pending[conversation] = [version, now]

    ingest_started = last_ingest_start(context.instance)
    run_requests = []
    for conversation, (version, seen_at) in sorted(pending.items()):
        if ingest_started is None or ingest_started <= seen_at:
            continue  # the store may not hold this version's turns yet
        run_requests.append(
            dg.RunRequest(
                run_key=f"summary:{conversation}:{version}",
                partition_key=conversation,
                tags={"memory_dag/conversation_version": version},
            )
        )
        requested[conversation] = version
        del pending[conversation]

    new_cursor = json.dumps(
        {"files": files, "requested": requested, "pending": pending}, sort_keys=True
    )
    partition_requests = [conversations.build_add_request(new_partitions)] if new_partitions else []
    if new_partitions:
        context.log.info(f"new conversations: {', '.join(new_partitions)}")
    skip_reason = None
    if not run_requests:
        skip_reason = (
            f"{len(pending)} changed conversation(s) waiting for an ingest run"
            if pending
            else "no changed conversations"
        )
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=partition_requests,
        cursor=new_cursor,
        skip_reason=skip_reason,
    )


@dg.asset_sensor(
    asset_key=conversation_summaries.key,
    job=summary_index_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Embeds and indexes summaries after any run wrote them.",
)
def summaries_indexed_sensor(
    context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry
) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=f"summary-index:{asset_event.run_id}",
        tags={"memory_dag/after_run": asset_event.run_id},
    )


SUMMARY_SENSORS = [conversations_sensor, summaries_indexed_sensor]
