"""The CLI's Dagster runs: marked with their process, freed when that process died, and stopped
cleanly on SIGINT / SIGTERM.

`memory-dag ingest` materializes assets in its own process, on the project's instance. A run
killed with SIGKILL stays STARTED in the instance and keeps its slot in the `duckdb` pool; every
later run then waits for that slot forever (Dagster's in-process executor polls for it and
ignores SIGINT meanwhile). So every CLI run carries its process id and host as tags, and before
starting, the CLI marks the runs whose process is gone as failed (`report_run_failed`) and
frees their pool slots (`free_concurrency_slots_for_run`), as well as slots still held by runs
that have ended. (Under `memory-dag ui`, the daemon's run monitoring also frees the slots of
ended runs: `free_slots_after_run_end_seconds` in data/dagster_home/dagster.yaml.)

The Dagster work runs in a worker thread so that the main thread still receives signals: on
SIGINT/SIGTERM it marks this process's runs failed, frees their slots and exits with a clear
message (the store keeps its last committed state:
DuckDB's write-ahead log and the atomic index swap make a stop like a crash, only announced).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

PID_TAG = "memory_dag/pid"
HOST_TAG = "memory_dag/host"

T = TypeVar("T")


def run_tags() -> dict[str, str]:
    """Tags that tie a run to this process, so a later CLI can tell when it died."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def free_dead_runs(instance: Any) -> list[str]:
    """Fail the runs whose process is gone and free every slot held by an ended run.

    A run's process is known from its tags (CLI runs of this host) or, on an instance kept in
    local SQLite files, from the pid Dagster records when a run starts executing (runs from
    before these tags, or from `dagster dev`). Returns the ids of the runs marked failed.
    """
    from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES, RunsFilter

    local = "sqlite" in type(instance.run_storage).__name__.lower()
    failed: list[str] = []
    for record in instance.get_run_records(filters=RunsFilter(statuses=NOT_FINISHED_STATUSES)):
        run = record.dagster_run
        owner = _run_process(instance, record, local)
        if owner is None or owner[0] == os.getpid():
            continue
        pid, seen_at = owner
        if _process_alive(pid, seen_at):
            continue
        instance.report_run_failed(
            run, f"memory-dag: the process that ran this (pid {pid}) is gone; marked failed"
        )
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        failed.append(run.run_id)
    _free_slots_of_ended_runs(instance)
    return failed


def _run_process(instance: Any, record: Any, local: bool) -> tuple[int, float] | None:
    """(pid, a time that process was surely alive) of the process executing a run on this
    host, or None when that cannot be known here."""
    from dagster._core.events import DagsterEventType

    run = record.dagster_run
    if HOST_TAG in run.tags:  # a CLI run: its process created it
        if run.tags[HOST_TAG] != socket.gethostname():
            return None
        return int(run.tags.get(PID_TAG, "0") or 0), record.create_timestamp.timestamp()
    if not local:
        return None  # a shared instance: the run may live on another machine
    events = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=10
    ).records
    for event in events:
        data = event.event_log_entry.dagster_event.event_specific_data
        pid = getattr(data, "metadata", {}).get("pid") if data is not None else None
        if pid is not None:  # the run worker said so while it ran
            return int(getattr(pid, "value", pid)), event.event_log_entry.timestamp
    return None


def fail_own_runs(instance: Any, reason: str) -> list[str]:
    """Mark this process's unfinished runs failed and free their slots (before exiting)."""
    from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES, RunsFilter

    records = instance.get_run_records(
        filters=RunsFilter(statuses=NOT_FINISHED_STATUSES, tags=run_tags())
    )
    for record in records:
        instance.report_run_failed(record.dagster_run, f"memory-dag: {reason}")
        instance.event_log_storage.free_concurrency_slots_for_run(record.dagster_run.run_id)
    return [record.dagster_run.run_id for record in records]


def _free_slots_of_ended_runs(instance: Any) -> None:
    """Slots and queued steps of runs that finished, failed or vanished: nothing needs them."""
    from dagster._core.storage.dagster_run import FINISHED_STATUSES

    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    holders: set[str] = set()
    for key in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(key)
        holders.update(slot.run_id for slot in info.claimed_slots)
        holders.update(step.run_id for step in info.pending_steps)
    for run_id in holders:
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in FINISHED_STATUSES:
            storage.free_concurrency_slots_for_run(run_id)


def _process_alive(pid: int, seen_at: float) -> bool:
    """True while `pid` is a live process that already existed at `seen_at` (when the run was
    created, or when its worker reported its pid).

    A zombie (killed, not yet reaped) is dead; a process that started later is another one
    that reused the id.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    stat = Path(f"/proc/{pid}/stat")
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True  # no /proc (not Linux): trust kill(0)
    if fields[0] == "Z":
        return False
    started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= seen_at + 1.0


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def start_in_background(work: Callable[[], T]) -> Callable[[], T]:
    """Start `work` in a daemon thread now; the returned function waits for its result (or
    raises its error). For slow start-up work (Dagster's imports) that overlaps other work."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # handed to the caller of `result`
            outcome["error"] = error

    worker = threading.Thread(target=target, name="memory-dag-background", daemon=True)
    worker.start()

    def result() -> T:
        while worker.is_alive():
            worker.join(0.2)  # signals keep reaching the main thread
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return result


def run_in_worker(work: Callable[[], T]) -> T:
    """Run `work` in a worker thread and wait; signals keep reaching this (main) thread.

    Raises whatever `work` raised, or the KeyboardInterrupt (`common.Interrupted`) the main thread
    received while waiting (the worker is then left to die with the process: `exit_now`).
    """
    return start_in_background(work)()
