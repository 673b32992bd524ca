"""Eight shards on Dagster's distributed parts, all real and on loopback: a Postgres instance,
the daemon's run queue with a per-shard tag limit, two Celery workers (Redis broker) running
one run each. Every shard is ingested, equals a single store of the same users, and runs of a
shard never overlap (checked from the event log). A worker killed mid-run fails the run
clearly; the shard stays readable and the re-run converges."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from memory_dag.config import Settings
from memory_dag.pipeline import run_all
from memory_dag.store.shards import (
    SHARD_TAG,
    all_shard_settings,
    shard_key,
    shard_of,
    user_key,
)
from tests.scale.corpus import users_covering, write_corpus
from tests.scale.servers import (  # noqa: F401
    BIN,
    REPO,
    WORKSPACE,
    Processes,
    child_pids,
    deployment_env,
    servers,
)
from tests.scale.test_shard_assets import settle
from tests.store_snapshot import differences, store_tables

pytestmark = pytest.mark.slow
SHARDS = 8
DONE = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
WORKER_EVENTS = {dg.DagsterEventType.RUN_START, dg.DagsterEventType.STEP_START}
BUSY = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def wait_for(condition: Callable[[], bool], what: str, logs: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(2)
    tails = {p.name: p.read_text(errors="replace")[-3000:] for p in logs.glob("*.log")}
    raise AssertionError(f"timed out waiting for {what}; logs: {json.dumps(tails, indent=1)}")


def run_intervals(instance: dg.DagsterInstance, run_id: str) -> tuple[float, float]:
    """(start, end) of a run from its event log."""
    events = instance.all_logs(
        run_id,
        of_type={
            dg.DagsterEventType.RUN_START,
            dg.DagsterEventType.RUN_SUCCESS,
            dg.DagsterEventType.RUN_FAILURE,
        },
    )
    start = min(
        e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.RUN_START
    )
    end = max(e.timestamp for e in events if e.dagster_event_type != dg.DagsterEventType.RUN_START)
    return start, end


def reference_store(shard: Settings, folder: Path) -> Path:
    """The same users' files in a single store, built by the library, as the runs build it."""
    single = Settings(workspace=folder / "workspace", db_path=folder / "memory.duckdb")
    shutil.copytree(shard.workspace, single.workspace)
    run_all(single)
    return Path(single.db_path)


def launch(env: dict[str, str], job: str, shard: str, *, wait: bool = True) -> subprocess.Popen:
    """Submit a run to the instance's queue, as the UI's launch button does (`wait`: until
    `dagster job launch` has exited, successfully)."""
    tags = json.dumps({"dagster/partition": shard, SHARD_TAG: shard})
    command = [str(BIN / "dagster"), "job", "launch", "-w", str(WORKSPACE), "-j", job]
    launching = subprocess.Popen(
        [*command, "--tags", tags],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if wait:
        assert launching.wait() == 0, f"dagster job launch {job} failed"
    return launching


@pytest.fixture
def deployment(servers, tmp_path: Path, monkeypatch, request):  # noqa: F811
    """Daemon + two workers over a workspace of users on every shard ("every shard"), or of
    four users of shard-03 ("one shard"; their two-user conversation lands on shard-06)."""
    data = tmp_path / "data"
    names = users_covering(SHARDS, 2)
    if getattr(request, "param", "every shard") == "one shard":
        names = [n for n in users_covering(SHARDS, 4) if shard_of(user_key(n), SHARDS) == 3]
    write_corpus(data / "workspace", names=names, sessions=2, turns=6)
    settle(data / "workspace")
    env = deployment_env(servers, tmp_path / "dagster_home", data, SHARDS)
    for key in ("DAGSTER_HOME", "MEMORY_DAG_POSTGRES_URL", "MEMORY_DAG_REDIS_URL"):
        monkeypatch.setenv(key, env[key])
    for key in ("MEMORY_DAG_SHARDS", "MEMORY_DAG_WORKSPACE", "MEMORY_DAG_DB"):
        monkeypatch.setenv(key, env[key])
    processes = Processes(env, tmp_path)
    try:
        processes.celery_worker("worker1")
        processes.celery_worker("worker2")
        processes.daemon()
        with dg.DagsterInstance.get() as instance:
            yield instance, processes, env, data, tmp_path
    finally:
        processes.stop_all()


def quiet(instance: dg.DagsterInstance, since: list[float]) -> bool:
    """No run queued or running for 20 s."""
    if instance.get_runs_count(dg.RunsFilter(statuses=BUSY)):
        since[0] = time.monotonic()
        return False
    return time.monotonic() - since[0] > 20


def test_eight_shards_run_side_by_side_one_writer_each_and_equal_single_stores(deployment) -> None:
    instance, processes, env, data, tmp_path = deployment
    settings = Settings.load()

    def ingested() -> list[str]:
        runs = instance.get_runs(dg.RunsFilter(job_name="ingest_job", statuses=DONE))
        return sorted(run.tags.get(SHARD_TAG, "") for run in runs)

    wait_for(lambda: len(ingested()) >= SHARDS, "an ingest run of every shard", tmp_path)
    since = [time.monotonic()]
    wait_for(lambda: quiet(instance, since), "the queue to drain", tmp_path)
    # The daemon read the code location from the standing code server all along: it started
    # none of its own (one it starts is its child, replaced at every workspace refresh).
    assert processes.named["code_server"].poll() is None
    assert child_pids(processes.named["daemon"].pid) == []
    processes.stop_all()

    # Every tick Dagster stored holds the shard sensor's cursor: only the name of its state
    # file (`ingest/sensor_state.py`), not every workspace file's state.
    (sensor,) = [s for s in instance.all_instigator_state() if s.name == "shard_workspace_sensor"]
    ticks = instance.get_ticks(sensor.instigator_origin_id, sensor.selector_id)
    assert len(ticks) >= 2 and {len(tick.cursor or "") for tick in ticks} <= set(range(100))

    runs = instance.get_runs()
    assert ingested() == [shard_key(s) for s in range(SHARDS)]
    for worker in ("worker1", "worker2"):  # deploy/local/dagster_celery_config.py
        assert "warmed up in" in (tmp_path / f"{worker}.log").read_text(), worker
    failed = [r.run_id for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
    assert not failed, failed
    messages = [
        str(event.message)
        for run in runs
        for event in instance.all_logs(run.run_id)
        if event.message
    ]
    assert not [m for m in messages if "lock" in m.lower() and "conflicting" in m.lower()]

    # One writer per shard: a shard's runs never overlap; different shards' runs did.
    intervals: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        intervals.setdefault(run.tags[SHARD_TAG], []).append(run_intervals(instance, run.run_id))
    for shard, spans in intervals.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"two runs of {shard} overlapped"
    everything = sorted(span for spans in intervals.values() for span in spans)
    assert any(b[0] < a[1] for a, b in zip(everything, everything[1:], strict=False)), (
        "no two runs ever ran at once: the second worker did nothing"
    )

    # Each shard holds what a single store of its users holds, table by table.
    for number, shard in enumerate(all_shard_settings(settings)):
        reference = reference_store(shard, tmp_path / f"single-{number}")
        assert store_tables(reference)["memories"]
        assert not differences(Path(shard.db_path), reference), shard_key(number)


def kill_a_rebuild(
    instance: dg.DagsterInstance, env: dict[str, str], shard_runs: Callable
) -> dg.DagsterRun:
    """Launch `reindex_job` on shard-03 and SIGKILL the worker process running it.

    A small shard's rebuild lasts about a second, less than `dagster job launch` takes to
    exit: the launch is not waited for, the run is polled every 20 ms, and its worker is
    frozen (SIGSTOP) before the run is checked once more, so the kill lands mid-run or not at
    all. A rebuild that still ends first is launched again (up to 12 times)."""
    for _ in range(12):
        before = {run.run_id for run in shard_runs(DONE + BUSY)}
        launching = launch(env, "reindex_job", shard_key(3), wait=False)
        deadline = time.monotonic() + 120
        run: dg.DagsterRun | None = None
        while time.monotonic() < deadline:
            if run is None:
                new = [r for r in shard_runs(DONE + BUSY) if r.run_id not in before]
                run = new[0] if new else None
            else:
                run = instance.get_run_by_id(run.run_id)
            if run is not None and run.status in DONE:
                break  # too quick: try again
            if run is not None and run.status == dg.DagsterRunStatus.STARTED:
                # The run worker's own events (the run's start, its steps) carry its pid.
                pids = {
                    event.dagster_event.pid
                    for event in instance.all_logs(run.run_id, of_type=WORKER_EVENTS)
                    if event.dagster_event and event.dagster_event.pid
                }
                if len(pids) == 1:
                    pid = pids.pop()
                    os.kill(pid, signal.SIGSTOP)  # it cannot end the run while we look
                    if instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED:
                        os.kill(pid, signal.SIGKILL)
                        launching.wait()
                        return run
                    os.kill(pid, signal.SIGCONT)
                    break
            time.sleep(0.02)
        launching.wait()
    raise AssertionError("no rebuild could be caught running")


@pytest.mark.parametrize("deployment", ["one shard"], indirect=True)
def test_a_worker_killed_mid_run_fails_the_run_and_the_rerun_converges(deployment) -> None:
    instance, processes, env, data, tmp_path = deployment
    settings = Settings.load()
    shard = all_shard_settings(settings)[3]

    def shard_runs(status: list[dg.DagsterRunStatus]) -> list[dg.DagsterRun]:
        return instance.get_runs(dg.RunsFilter(tags={SHARD_TAG: shard_key(3)}, statuses=status))

    wait_for(lambda: bool(shard_runs(DONE)), "the first run of shard-03", tmp_path)
    since = [time.monotonic()]
    wait_for(lambda: quiet(instance, since), "the queue to drain", tmp_path)
    expected = tmp_path / "before-the-kill.duckdb"
    shutil.copy(shard.db_path, expected)

    # A forced rebuild of the shard; kill the process running it once it has started (a run
    # that finishes before the kill lands is launched again: the rebuild takes seconds).
    killed = kill_a_rebuild(instance, env, shard_runs)
    wait_for(
        lambda: instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE,
        "run monitoring to fail the killed run",
        tmp_path,
    )
    # The shard is readable at its last committed state, and its index still answers.
    with duckdb.connect(str(shard.db_path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM chunks").fetchone()[0] > 0
    assert (Path(shard.index_dir) / "CURRENT").exists()

    # The shard is not blocked: the re-run goes through and converges to the same content.
    before = {r.run_id for r in shard_runs(DONE + BUSY)}
    launch(env, "reindex_job", shard_key(3))
    wait_for(
        lambda: any(r.run_id not in before for r in shard_runs([dg.DagsterRunStatus.SUCCESS])),
        "the re-run",
        tmp_path,
    )
    since = [time.monotonic()]
    wait_for(lambda: quiet(instance, since), "the queue to drain", tmp_path)
    processes.stop_all()
    assert not differences(Path(shard.db_path), expected)
