"""The Dagster layer for real: definitions load, assets materialize over a temp store, checks
run (and block), the workspace sensor and the schedule are evaluated."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import dagster as dg
import pytest

from assets.checks import INGEST_CHECKS
from assets.index import CHUNKS_FTS, SEARCH_INDEX
from assets.jobs import FIRST_STAGES as INGEST_ASSETS
from assets.resources import MemoryStoreResource
from memory_dag.config import Settings
from memory_dag.definitions import defs
from memory_dag.index.search import search
from memory_dag.store.connection import open_store
from schedules.maintenance import full_sync_schedule
from sensors.workspace import DEBOUNCE_SECONDS, workspace_sensor
from tests.conftest import write_jsonl


def resource_for(settings: Settings) -> MemoryStoreResource:
    return MemoryStoreResource(
        workspace=str(settings.workspace),
        db_path=str(settings.db_path),
        index_dir=str(settings.index_dir),
    )


def age_files(folder: Path, seconds: float = 60) -> None:
    """Make every file look written `seconds` ago (older than the sensor's debounce)."""
    past = time.time() - seconds
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def test_definitions_load() -> None:
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    assert {job.name for job in repository.get_all_jobs()} >= {"ingest_job", "reindex_job"}
    assert repository.has_sensor_def("workspace_sensor")
    assert repository.has_schedule_def("full_sync_schedule")
    for asset in INGEST_ASSETS:
        assert asset.op.pool == "duckdb", asset.keys  # one writer at a time


def test_materialize_every_asset_with_metadata_and_checks(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [*INGEST_ASSETS, *INGEST_CHECKS],
            resources={"memory": resource_for(settings)},
            instance=instance,
        )
        assert result.success
        metadata = {
            e.materialization.asset_key.to_user_string(): e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
        assert set(metadata) == {k.to_user_string() for a in INGEST_ASSETS for k in a.keys}
        assert metadata["workspace_files"]["new"].value == 6
        assert metadata["workspace_files"]["errors"].value == 1
        assert (
            "sessions/conv-a/s2.jsonl | 2 |" in metadata["workspace_files"]["error_details"].value
        )
        assert metadata["chunks"]["chunks"].value == 9
        assert metadata["search_index"]["rows"].value == 9
        assert "preview" in metadata["chunks"]
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert checks == {
            "chunks_are_valid": True,
            "every_chunk_embedded": True,
            "index_matches_embeddings": True,
        }
    assert search("Priya", settings=settings, k=1, min_score=0.0)[0].turn_ids == ["t3"]


def test_either_index_can_be_materialized_alone(settings: Settings) -> None:
    """`search_index` and `chunks_fts` share a step, yet each can be selected on its own."""
    resources = {"memory": resource_for(settings)}
    with dg.instance_for_test() as instance:
        upstream = [
            key for a in INGEST_ASSETS for key in a.keys if key not in (SEARCH_INDEX, CHUNKS_FTS)
        ]
        assert dg.materialize(
            INGEST_ASSETS, selection=upstream, resources=resources, instance=instance
        ).success

        for only in (CHUNKS_FTS, SEARCH_INDEX):
            result = dg.materialize(
                INGEST_ASSETS, selection=[only], resources=resources, instance=instance
            )
            built = {e.materialization.asset_key for e in result.get_asset_materialization_events()}
            assert built == {only}

    with open_store(settings.db_path, read_only=True) as con:
        tables = {
            row[0] for row in con.execute("SELECT schema_name FROM duckdb_schemas()").fetchall()
        }
    assert "fts_main_chunks" in tables
    assert search("Priya", settings=settings, k=1, min_score=0.0)[0].turn_ids == ["t3"]


def test_a_failing_blocking_check_stops_the_index_build(settings: Settings) -> None:
    resources = {"memory": resource_for(settings)}
    with dg.instance_for_test() as instance:
        assert dg.materialize(INGEST_ASSETS, resources=resources, instance=instance).success
        with open_store(settings.db_path) as con:  # a chunk whose file does not exist
            con.execute(
                "INSERT INTO chunks (id, path, source, kind, start_line, end_line, hash, text, "
                "search_text, tokens, updated_at) VALUES ('ghost', 'ghost.md', 'memory', "
                "'note', 5, 2, 'h', '', '', 0, now())"
            )
        result = dg.materialize(
            [*INGEST_ASSETS, *INGEST_CHECKS],
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )
        assert not result.success
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert checks["chunks_are_valid"].passed is False
        failures = str(checks["chunks_are_valid"].metadata["failures"].value)
        assert "end_line" in failures and "file_known" in failures
        built = {
            e.materialization.asset_key.to_user_string()
            for e in result.get_asset_materialization_events()
        }
        assert "search_index" not in built and "chunk_embeddings" not in built


def evaluate(
    cursor: str | None, settings: Settings, instance: dg.DagsterInstance
) -> dg.SensorResult:
    """One tick. The sensor reads the filesystem, and the instance for summary partitions
    (made before the files of the timing tests are written: it takes longer than the
    debounce)."""
    context = dg.build_sensor_context(
        cursor=cursor, instance=instance, resources={"memory": resource_for(settings)}
    )
    return workspace_sensor(context)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as test_instance:
        yield test_instance


def test_sensor_requests_one_run_per_workspace_version(
    settings: Settings, instance: dg.DagsterInstance
) -> None:
    workspace = Path(settings.workspace)
    age_files(workspace)

    first = evaluate(None, settings, instance)
    assert len(first.run_requests) == 1
    first_key = first.run_requests[0].run_key
    assert "6 new" in first.run_requests[0].tags["memory_dag/changes"]
    # The files' state is beside the store; the cursor (stored with every tick) names it.
    (state_file,) = Path(f"{settings.db_path}.sensors").iterdir()
    assert json.loads(first.cursor) == {"state": state_file.name.split("-")[-1][:-5]}

    quiet = evaluate(first.cursor, settings, instance)
    assert quiet.run_requests == [] and quiet.skip_reason

    # After a cursor reset the same workspace gives the same run key: Dagster dedupes it.
    assert evaluate(None, settings, instance).run_requests[0].run_key == first_key

    (workspace / "memory" / "garden.md").write_text("# Garden\n\nPeppers too.\n")
    (workspace / "sessions" / "conv-b" / "s9.jsonl").unlink()
    age_files(workspace)
    changed = evaluate(first.cursor, settings, instance)
    assert len(changed.run_requests) == 1
    assert changed.run_requests[0].run_key != first_key
    assert "1 changed, 1 deleted" in changed.run_requests[0].tags["memory_dag/changes"]


def test_sensor_ignores_a_touch_and_waits_for_files_being_written(
    settings: Settings, instance: dg.DagsterInstance
) -> None:
    workspace = Path(settings.workspace)
    age_files(workspace)
    cursor = evaluate(None, settings, instance).cursor

    age_files(workspace, seconds=30)  # mtime changes, content does not
    touched = evaluate(cursor, settings, instance)
    assert touched.run_requests == []

    new = write_jsonl(
        workspace / "sessions" / "conv-c" / "new.jsonl", [{"role": "user", "content": "hello"}]
    )
    started = time.monotonic()
    ready = evaluate(touched.cursor, settings, instance)  # written just now: waits it out
    assert time.monotonic() - started >= DEBOUNCE_SECONDS
    assert "1 new" in ready.run_requests[0].tags["memory_dag/changes"]

    # A file still being written when the wait ends is left for the next tick.
    stop = threading.Event()

    def keep_writing() -> None:
        while not stop.is_set():
            with new.open("a", encoding="utf-8") as out:
                out.write('{"role": "assistant", "content": "more"}\n')
            time.sleep(0.2)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        time.sleep(0.3)
        settling = evaluate(ready.cursor, settings, instance)
    finally:
        stop.set()
        writer.join()
    assert settling.run_requests == []
    assert "still being written" in settling.skip_reason.skip_message
    age_files(workspace)
    later = evaluate(settling.cursor, settings, instance)
    assert "1 changed" in later.run_requests[0].tags["memory_dag/changes"]


def test_full_sync_schedule_requests_the_ingest_job() -> None:
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 22, 5, 0))
    result = full_sync_schedule.evaluate_tick(context)
    assert len(result.run_requests) == 1
    assert full_sync_schedule.job_name == "ingest_job"
    assert full_sync_schedule.cron_schedule == "0 * * * *"


def use_env(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """Point the code location's default resource at the test store (as `dagster dev` would)."""
    monkeypatch.setenv("MEMORY_DAG_WORKSPACE", str(settings.workspace))
    monkeypatch.setenv("MEMORY_DAG_DB", str(settings.db_path))
    monkeypatch.setenv("MEMORY_DAG_INDEX_DIR", str(settings.index_dir))


@pytest.mark.parametrize("job_name", ["ingest_job", "reindex_job"])
def test_jobs_run_the_whole_graph(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, job_name: str
) -> None:
    use_env(monkeypatch, settings)
    job = defs.resolve_job_def(job_name)
    with dg.instance_for_test() as instance:
        first = job.execute_in_process(instance=instance)
        assert first.success
        second = job.execute_in_process(instance=instance)
        assert second.success
    with open_store(settings.db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM chunks").fetchone()[0] == 9
    materialized = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in second.get_asset_materialization_events()
    }
    if job_name == "reindex_job":  # re-reads every file and rebuilds every index
        assert materialized["workspace_files"]["changed"].value == 6
        assert {"chunks", "search_index", "chunks_fts"} <= set(materialized)
    else:  # nothing changed: the files step observes, every later step is skipped
        assert materialized == {}
        [observed] = [e for e in second.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        assert observed.asset_observation_data.asset_observation.metadata["changed"].value == 0
