"""End to end through the real UI stack: `dagster dev -w workspace.yaml` from the repo root
(webserver + daemon + code server), driven through the webserver's GraphQL API the way the UI
drives it. Two runs launched at once (ingest and forced reindex) and the workspace sensor's
own run must all succeed: the `duckdb` pool (limit 1 in the instance's dagster.yaml) keeps
their steps from ever overlapping. The published index is then searched in this process.

Duration: the pool serialises all 24 steps of the three runs. The sensor's run uses the default
multiprocess executor, which starts a Python process per step while holding the slot (~110 s
of slot time with the 2 cores shared, against ~18 s for each in-process run); our two runs ask
for the in-process executor (see IN_PROCESS). Measured 3-4.5 min at load 4-10; the waits allow
for that and fail with the server log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
import yaml

from memory_dag.config import ENV_PREFIX, Settings
from memory_dag.index.search import search
from memory_dag.store.connection import open_store

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCATION = "memory_dag.definitions"
REPOSITORY = "__repository__"
#: The ingest graph and its edges. Other assets may join the location (and these assets may
#: gain upstreams), so the test asserts these at least, not only these.
ASSET_DEPS = {
    "workspace_files": set(),
    "chunks": {"workspace_files"},
    "chunk_embeddings": {"chunks"},
    "search_index": {"chunks", "chunk_embeddings"},
    "chunks_fts": {"chunks"},
}
#: Step keys of one run: the assets' steps (`indexes` builds search_index and chunks_fts) and
#: the three checks (`<asset>_<check>`).
STEP_KEYS = {"workspace_files", "chunks", "chunk_embeddings", "indexes"} | {
    "chunks_chunks_are_valid",
    "chunk_embeddings_every_chunk_embedded",
    "search_index_index_matches_embeddings",
}
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
#: Launchpad config for our two runs. Under the pool every step is serialised anyway, and the
#: default multiprocess executor spends ~5 s (far more on a loaded machine) starting a Python
#: process per step while holding the slot. The sensor's run keeps the default executor, so
#: both executors are covered. Used only if the jobs accept it (see `launch_config`).
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}

#: Generous budgets: 2 shared cores, and three runs whose 24 steps the pool serialises.
STARTUP_SECONDS = 120.0
RUNS_SECONDS = 480.0
POLL_SECONDS = 2.0

T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def age_files(folder: Path, seconds: float = 60) -> None:
    """Older than the sensor's debounce, so its first tick sees every file."""
    past = time.time() - seconds
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


@dataclass
class DagsterDev:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log_tail(self, chars: int = 12_000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]

    def fail(self, message: str) -> NoReturn:
        pytest.fail(f"{message}\n--- dagster dev log (tail) ---\n{self.log_tail()}")

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            self.fail(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def wait_for(self, what: str, probe: Callable[[], T | None], deadline: float) -> T:
        """Call `probe` until it returns something other than None, up to `deadline`
        (a `time.monotonic()` value); fail with the server log if it never does."""
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                self.fail(
                    f"dagster dev exited ({self.process.returncode}) while waiting for {what}"
                )
            value = probe()
            if value is not None:
                return value
            if time.monotonic() >= deadline:
                waited = time.monotonic() - started
                self.fail(f"gave up after {waited:.0f}s waiting for {what}")
            time.sleep(POLL_SECONDS)


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole group (dagster dev shuts its children down), then SIGKILL leftovers."""
    group = process.pid  # start_new_session=True: the group id is the leader's pid
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):  # stragglers: step or run workers
        os.killpg(group, signal.SIGKILL)
    process.wait(timeout=10)


@pytest.fixture
def store_settings(tmp_path: Path, workspace: Path) -> Settings:
    return Settings(
        workspace=workspace,
        db_path=tmp_path / "store" / "memory.duckdb",
        index_dir=tmp_path / "store" / "index",
    )


@pytest.fixture
def dagster_dev(tmp_path: Path, store_settings: Settings) -> Iterator[DagsterDev]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "data" / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    instance_config = yaml.safe_load((home / "dagster.yaml").read_text())
    assert instance_config["concurrency"]["pools"]["default_limit"] == 1  # what is under test
    age_files(store_settings.workspace)
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(
        DAGSTER_HOME=str(home),
        MEMORY_DAG_WORKSPACE=str(store_settings.workspace),
        MEMORY_DAG_DB=str(store_settings.db_path),
        MEMORY_DAG_INDEX_DIR=str(store_settings.index_dir),
        PYTHONUNBUFFERED="1",
    )
    port = free_port()
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster)] if dagster.exists() else [sys.executable, "-m", "dagster"]
    command += ["dev", "-w", "workspace.yaml", "--host", "127.0.0.1", "--port", str(port)]
    log_path = tmp_path / "dagster-dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield DagsterDev(process, f"http://127.0.0.1:{port}", log_path)
    finally:
        stop_process_group(process)


# --- GraphQL documents (the queries the UI sends, trimmed to what is asserted) ---------------

WORKSPACE_QUERY = """
query {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on PythonError { message }
          ... on RepositoryLocation {
            name
            repositories {
              name
              jobs { name }
              sensors { name sensorState { status } }
              assetNodes {
                assetKey { path }
                dependencyKeys { path }
                pools
                jobNames
              }
            }
          }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""

LAUNCH_RUN = """
mutation LaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on PipelineNotFoundError { message }
  }
}
"""

CONFIG_VALID = """
query ConfigValid($pipeline: PipelineSelector!, $runConfigData: RunConfigData) {
  isPipelineConfigValid(pipeline: $pipeline, mode: "default", runConfigData: $runConfigData) {
    __typename
  }
}
"""

RUN_STATUS = """
query RunStatus($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status }
    ... on RunNotFoundError { message }
    ... on PythonError { message }
  }
}
"""

RUN_FIELDS = """
  runId
  jobName
  status
  tags { key value }
  stepStats { stepKey status startTime endTime }
  assetMaterializations {
    assetKey { path }
    metadataEntries { label ... on IntMetadataEntry { intValue } }
  }
"""

ALL_RUNS = (
    "query { runsOrError { __typename ... on Runs { results {" + RUN_FIELDS + "} } "
    "... on PythonError { message } } }"
)

RUN_ERRORS = """
query RunErrors($runId: ID!) {
  runOrError(runId: $runId) {
    ... on Run {
      eventConnection(limit: 500) {
        events { __typename ... on MessageEvent { message level stepKey } }
      }
    }
  }
}
"""

SENSOR_TICKS = """
query SensorTicks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor {
      sensorState {
        status
        ticks(limit: 20) { status runIds skipReason error { message } }
      }
    }
  }
}
"""


def error_events(server: DagsterDev, run_id: str) -> str:
    data = server.graphql(RUN_ERRORS, {"runId": run_id})
    events = data["runOrError"]["eventConnection"]["events"]
    return "\n".join(
        f"{e.get('stepKey')}: {e.get('message')}" for e in events if e.get("level") == "ERROR"
    )


def loaded_location(server: DagsterDev) -> dict[str, Any] | None:
    try:
        data = server.graphql(WORKSPACE_QUERY)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None  # the webserver is not answering yet
    workspace = data["workspaceOrError"]
    if workspace["__typename"] != "Workspace":
        server.fail(f"workspace failed to load: {workspace}")
    entries = workspace["locationEntries"]
    if not entries or any(e["loadStatus"] != "LOADED" for e in entries):
        return None
    return {"entries": entries}


def settled(run: dict[str, Any]) -> bool:
    """The run's files step found the store as the last whole run left it
    (`memory_dag/graph_state.py`): it succeeded and Dagster skipped every later step."""
    statuses = {s["stepKey"]: s["status"] for s in run["stepStats"]}
    later = [status for key, status in statuses.items() if key != "workspace_files"]
    return (
        statuses.get("workspace_files") == "SUCCESS"
        and bool(later)
        and all(status == "SKIPPED" for status in later)
    )


def workspace_files_counts(run: dict[str, Any]) -> dict[str, int]:
    """The int metadata of the run's `workspace_files` materialization (new, changed, ...)."""
    materialized = {"/".join(m["assetKey"]["path"]): m for m in run["assetMaterializations"]}
    assert set(ASSET_DEPS) <= set(materialized), run["runId"]
    entries = materialized["workspace_files"]["metadataEntries"]
    return {e["label"]: e["intValue"] for e in entries if e.get("intValue") is not None}


def launch_config(server: DagsterDev, job: str) -> dict[str, Any]:
    """IN_PROCESS if the job's executor takes it (the default multi-or-in-process one does);
    else the job's own default config, exactly as a click in the UI would send it."""
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "pipelineName": job,
    }
    result = server.graphql(CONFIG_VALID, {"pipeline": selector, "runConfigData": IN_PROCESS})[
        "isPipelineConfigValid"
    ]
    return IN_PROCESS if result["__typename"] == "PipelineConfigValidationValid" else {}


def launch(server: DagsterDev, job: str) -> str:
    params = {
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "jobName": job,
        },
        "runConfigData": launch_config(server, job),
        "executionMetadata": {"tags": [{"key": "memory_dag/test", "value": "e2e"}]},
    }
    result = server.graphql(LAUNCH_RUN, {"executionParams": params})["launchRun"]
    if result["__typename"] != "LaunchRunSuccess":
        server.fail(f"launchRun {job} failed: {result}")
    return str(result["run"]["runId"])


def run_status(server: DagsterDev, run_id: str) -> str:
    result = server.graphql(RUN_STATUS, {"runId": run_id})["runOrError"]
    if result["__typename"] != "Run":
        server.fail(f"runOrError {run_id}: {result}")
    return str(result["status"])


@pytest.mark.slow
def test_dagster_dev_runs_ingest_and_reindex_at_once(
    dagster_dev: DagsterDev, store_settings: Settings
) -> None:
    server = dagster_dev

    # 1. The code location loads, under the names the launch selector uses, with the graph.
    workspace = server.wait_for(
        "the webserver and the code location",
        lambda: loaded_location(server),
        time.monotonic() + STARTUP_SECONDS,
    )
    entries = workspace["entries"]
    assert [e["name"] for e in entries] == [LOCATION]
    location = entries[0]["locationOrLoadError"]
    assert location["__typename"] == "RepositoryLocation", location
    assert [r["name"] for r in location["repositories"]] == [REPOSITORY]
    repository = location["repositories"][0]
    assert {"ingest_job", "reindex_job"} <= {j["name"] for j in repository["jobs"]}
    graph = {"/".join(node["assetKey"]["path"]): node for node in repository["assetNodes"]}
    assert set(ASSET_DEPS) <= set(graph)
    for name, deps in ASSET_DEPS.items():
        node = graph[name]
        assert deps <= {"/".join(d["path"]) for d in node["dependencyKeys"]}, name
        assert node["pools"] == ["duckdb"], name
        assert {"ingest_job", "reindex_job"} <= set(node["jobNames"]), name
    sensors = {s["name"]: s["sensorState"]["status"] for s in repository["sensors"]}
    assert sensors["workspace_sensor"] == "RUNNING"

    # 2. Both jobs launched at once, as two clicks in the UI would.
    ingest_run = launch(server, "ingest_job")
    reindex_run = launch(server, "reindex_job")
    ours = {ingest_run: "ingest_job", reindex_run: "reindex_job"}
    deadline = time.monotonic() + RUNS_SECONDS  # one budget for every wait below

    def both_finished() -> dict[str, str] | None:
        statuses = {run_id: run_status(server, run_id) for run_id in ours}
        return statuses if set(statuses.values()) <= TERMINAL else None

    statuses = server.wait_for("ingest_job and reindex_job to finish", both_finished, deadline)
    for run_id, status in statuses.items():
        if status != "SUCCESS":
            server.fail(
                f"{ours[run_id]} run {run_id} ended {status}:\n{error_events(server, run_id)}"
            )

    # 3. The sensor's first tick (cursor empty, files older than the debounce) asks for a run.
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "sensorName": "workspace_sensor",
    }

    def completed_ticks() -> list[dict[str, Any]] | None:
        data = server.graphql(SENSOR_TICKS, {"selector": selector})["sensorOrError"]
        ticks = [t for t in data["sensorState"]["ticks"] if t["status"] != "STARTED"]
        return ticks or None

    ticks = server.wait_for("the workspace sensor's first tick", completed_ticks, deadline)
    assert not [t for t in ticks if t["status"] == "FAILURE"], ticks
    sensor_runs = {run_id for t in ticks for run_id in t["runIds"]}
    assert [t["status"] for t in ticks].count("SUCCESS") == 1, ticks
    assert len(sensor_runs) == 1, ticks

    # 4. Every run in the instance ends in SUCCESS: ours, the workspace sensor's, and any
    #    other sensor's or schedule's (the hourly schedule's, if the clock crossed the hour).
    def all_runs_finished() -> list[dict[str, Any]] | None:
        runs = server.graphql(ALL_RUNS)["runsOrError"]["results"]
        return runs if all(r["status"] in TERMINAL for r in runs) else None

    runs = server.wait_for("every run in the instance to finish", all_runs_finished, deadline)
    by_id = {r["runId"]: r for r in runs}
    assert set(ours) | sensor_runs <= set(by_id)
    for run in runs:
        tags = {t["key"]: t["value"] for t in run["tags"]}
        if run["runId"] not in ours:
            assert {"dagster/sensor_name", "dagster/schedule_name"} & set(tags), run
        if run["status"] != "SUCCESS":
            server.fail(
                f"run {run['runId']} ({run['jobName']}, tags {tags}) ended "
                f"{run['status']}:\n{error_events(server, run['runId'])}"
            )
        if settled(run):  # a run after a whole one found nothing due: later steps skipped
            assert run["runId"] != reindex_run, "a forced run is never skipped"
        else:
            assert all(s["status"] == "SUCCESS" for s in run["stepStats"]), run["stepStats"]
    (sensor_run,) = sensor_runs
    assert by_id[sensor_run]["jobName"] == "ingest_job"
    ingest_runs = [
        r for r in runs if r["jobName"] in ("ingest_job", "reindex_job") and not settled(r)
    ]
    assert reindex_run in {r["runId"] for r in ingest_runs}
    for run in ingest_runs:
        assert {s["stepKey"] for s in run["stepStats"]} >= STEP_KEYS, run["stepStats"]
        # The reindex run got the job's `force: true` (re-read every file); ingests did not.
        files = workspace_files_counts(run)
        assert files["files"] == 6, files
        if run["runId"] == reindex_run:
            assert (files["unchanged"], files["new"] + files["changed"]) == (0, 6), files
        else:
            assert (files["changed"], files["new"] + files["unchanged"]) == (0, 6), files

    # 5. The pool serialised the DuckDB steps of all runs: no two of them overlapped.
    steps = sorted(
        (s["startTime"], s["endTime"], f"{run['jobName']}/{s['stepKey']}")
        for run in ingest_runs
        for s in run["stepStats"]
        if s["stepKey"] in STEP_KEYS
    )
    assert len(steps) == len(STEP_KEYS) * len(ingest_runs)
    for (_, end, before), (start, _, after) in zip(steps, steps[1:], strict=False):
        assert start >= end, f"{after} started before {before} ended"

    # 6. The store is consistent (no duplicate rows from three concurrent ingests) and the
    #    published index answers: the turn that says where Dana's sister lives.
    with open_store(store_settings.db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM chunks").fetchone()[0] == 9
        assert con.execute("SELECT count(DISTINCT id) FROM chunks").fetchone()[0] == 9
    hits = search(
        "Where does Dana's sister live?", settings=store_settings, conversation="conv-a", k=3
    )
    assert hits, "no search results"
    assert hits[0].turn_ids == ["t3"]
    assert hits[0].path == "sessions/conv-a/s1.jsonl"
    assert "Toronto" in hits[0].snippet
