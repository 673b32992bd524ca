"""A `memory-dag ingest` killed at any stage never blocks later runs, and SIGINT/SIGTERM stop the
CLI with a message (memory_dag/cli/dagster_runs.py).

The kill test chains real processes on one Dagster instance (the project's dagster.yaml: one
`duckdb` slot): each is SIGKILLed when its run starts the next stage, so each must first get
past the slot its killed predecessor held; the last one runs to the end within a bound.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES, RunsFilter

from memory_dag.cli.dagster_runs import HOST_TAG, PID_TAG, free_dead_runs, run_tags
from memory_dag.config import Settings
from memory_dag.store.connection import open_store
from tests.kill_points import (
    check_readable,
    cli_env,
    dagster_home,
    ingest_command,
    open_instance,
    start_ingest,
    started_steps,
)

#: The stages (asset steps) of one `memory-dag ingest`, in the order they run, ending with the
#: summaries of a conversation partition. (benchmarks/hostile.py also kills inside the checks
#: and mid-step: more than 20 points.)
STAGES = [
    "workspace_files",
    "chunks",
    "facts",
    "entities",
    "chunk_embeddings",
    "indexes",
    "conversation_summaries",
]
#: Seconds a whole ingest of the small workspace may take after a kill (it takes ~15 s).
GENEROUS = 300


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return dagster_home(tmp_path / "dagster_home")


def _kill_when_started(process: subprocess.Popen, home: Path, stage: str) -> bool:
    """SIGKILL `process` as soon as its run starts `stage` (or a later one, should the poll
    miss a short step); False if it ended first."""
    later = set(STAGES[STAGES.index(stage) :])
    instance = open_instance(home)
    try:
        deadline = time.monotonic() + GENEROUS
        while time.monotonic() < deadline and process.poll() is None:
            if later & set(started_steps(instance, process.pid)):
                process.send_signal(signal.SIGKILL)
                process.wait()
                return True
            time.sleep(0.02)
        return False
    finally:
        instance.dispose()


def test_kill_9_at_every_stage_then_ingest_completes(
    settings: Settings, home: Path, tmp_path: Path
) -> None:
    killed: list[str] = []
    for stage in STAGES:
        process = start_ingest(settings, home, "--json", cwd=tmp_path)
        try:
            if _kill_when_started(process, home, stage):
                killed.append(stage)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        check_readable(settings)

    done = subprocess.run(
        ingest_command(settings),
        env=cli_env(home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GENEROUS,
    )

    assert done.returncode == 0, done.stderr
    assert killed == STAGES  # each process reached its stage: none hung on a dead one's slot
    check_readable(settings)
    with open_store(settings.db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM chunks").fetchone()[0] == 9
    instance = open_instance(home)
    try:
        # Every run a killed process left unfinished was marked failed by the next one.
        stuck = instance.get_run_records(filters=RunsFilter(statuses=NOT_FINISHED_STATUSES))
        assert stuck == []
        storage = instance.event_log_storage
        assert storage.get_concurrency_info("duckdb").claimed_slots == []
    finally:
        instance.dispose()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_ingest_with_a_message_and_frees_its_run(
    settings: Settings, home: Path, tmp_path: Path, signum: int, code: int
) -> None:
    process = start_ingest(
        settings,
        home,
        "--force",
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    instance = open_instance(home)
    try:
        deadline = time.monotonic() + GENEROUS
        while "chunks" not in started_steps(instance, process.pid):
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)

        assert process.returncode == code
        name = signal.Signals(signum).name
        assert f"memory-dag: stopped by {name}; the store keeps its last committed state" in stderr
        assert "Traceback" not in stderr
        [record] = instance.get_run_records(filters=RunsFilter(tags={PID_TAG: str(process.pid)}))
        assert record.dagster_run.status == dg.DagsterRunStatus.FAILURE
        assert instance.event_log_storage.get_concurrency_info("duckdb").claimed_slots == []
    finally:
        if process.poll() is None:
            process.kill()
        instance.dispose()
    check_readable(settings)


# --- free_dead_runs on its own -----------------------------------------------------------------


@dg.op
def _noop() -> None:
    return None


@dg.job
def _job() -> None:
    _noop()


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()  # reaped: the pid names no process now
    return process.pid


def _started_run(instance: dg.DagsterInstance, pid: int) -> str:
    tags = {**run_tags(), PID_TAG: str(pid)}
    run = instance.create_run_for_job(_job, status=dg.DagsterRunStatus.STARTED, tags=tags)
    instance.event_log_storage.claim_concurrency_slot("duckdb", run.run_id, "step")
    return run.run_id


def test_a_dead_process_run_is_failed_and_its_slot_freed_a_live_one_kept() -> None:
    overrides = {"concurrency": {"pools": {"default_limit": 1}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        dead_run = _started_run(instance, _dead_pid())
        with subprocess.Popen(["sleep", "30"]) as alive:
            try:
                live_run = instance.create_run_for_job(
                    _job,
                    status=dg.DagsterRunStatus.STARTED,
                    tags={**run_tags(), PID_TAG: str(alive.pid)},
                ).run_id

                failed = free_dead_runs(instance)

                assert failed == [dead_run]
                assert instance.get_run_by_id(dead_run).status == dg.DagsterRunStatus.FAILURE
                assert instance.get_run_by_id(live_run).status == dg.DagsterRunStatus.STARTED
                info = instance.event_log_storage.get_concurrency_info("duckdb")
                assert info.claimed_slots == []
            finally:
                alive.kill()


def test_a_pid_reused_after_the_run_started_counts_as_dead() -> None:
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(
            _job, status=dg.DagsterRunStatus.STARTED, tags={HOST_TAG: run_tags()[HOST_TAG]}
        )
        time.sleep(3)  # the next process starts clearly after the run (boot time has 1 s steps)
        with subprocess.Popen(["sleep", "30"]) as newer:
            try:
                instance.add_run_tags(run.run_id, {PID_TAG: str(newer.pid)})

                assert free_dead_runs(instance) == [run.run_id]
            finally:
                newer.kill()


def _report_worker_pid(instance: dg.DagsterInstance, run_id: str, pid: int) -> None:
    """What a run worker started by anything but the CLI (`dagster dev`, an older memory-dag)
    records: only this pid tells whose run it is."""
    instance.report_engine_event(
        f"Started process for run (pid: {pid}).",
        instance.get_run_by_id(run_id),
        EngineEventData(metadata={"pid": dg.MetadataValue.text(str(pid))}),
    )


def test_runs_without_tags_are_judged_by_the_pid_their_worker_reported() -> None:
    overrides = {"concurrency": {"pools": {"default_limit": 2}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        dead_run = instance.create_run_for_job(_job, status=dg.DagsterRunStatus.STARTED).run_id
        _report_worker_pid(instance, dead_run, _dead_pid())
        instance.event_log_storage.claim_concurrency_slot("duckdb", dead_run, "step")
        queued = instance.create_run_for_job(_job, status=dg.DagsterRunStatus.STARTED).run_id
        time.sleep(3)  # its worker starts well after the run was created (a queued run)
        with subprocess.Popen(["sleep", "30"]) as worker:
            try:
                _report_worker_pid(instance, queued, worker.pid)

                assert free_dead_runs(instance) == [dead_run]
                assert instance.get_run_by_id(queued).status == dg.DagsterRunStatus.STARTED
                info = instance.event_log_storage.get_concurrency_info("duckdb")
                assert info.claimed_slots == []
            finally:
                worker.kill()
