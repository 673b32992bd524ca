"""The sharded Dagster graph: partitions per shard, the shard resource, fan-out schedules and
the shard sensor (real runs on a test instance)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from assets.shards import sharded_definitions
from memory_dag.definitions import defs as single_store_defs
from memory_dag.store.shards import SHARD_TAG, SHARDS_ENV, shard_key, shard_of
from tests.scale.corpus import write_corpus

SHARDS = 4


def settle(root: Path) -> None:
    """Date every file a minute back: the sensors wait for files still being written."""
    for path in root.rglob("*"):
        if path.is_file():
            stamp = path.stat().st_mtime - 60
            os.utime(path, (stamp, stamp))


@pytest.fixture
def sharded(tmp_path: Path, monkeypatch) -> tuple[dg.Definitions, Path, list[str]]:
    workspace = tmp_path / "ws"
    users = write_corpus(workspace, users=6)
    settle(workspace)
    monkeypatch.setenv(SHARDS_ENV, str(SHARDS))
    monkeypatch.setenv("MEMORY_DAG_WORKSPACE", str(workspace))
    monkeypatch.setenv("MEMORY_DAG_DB", str(tmp_path / "data" / "memory.duckdb"))
    return sharded_definitions(single_store_defs, SHARDS), tmp_path / "data", users


def test_every_job_is_partitioned_by_shard_and_one_sensor_routes(sharded) -> None:
    defs, _, _ = sharded
    dg.Definitions.validate_loadable(defs)
    keys = [shard_key(s) for s in range(SHARDS)]
    for name in ("ingest_job", "maintenance_job", "decay_job", "summaries_job", "reindex_job"):
        assert defs.resolve_job_def(name).partitions_def.get_partition_keys() == keys
    # The single store's sensors watch the one workspace: the shard sensor replaces them.
    assert [sensor.name for sensor in defs.sensors] == ["shard_workspace_sensor"]
    # The single-store graph is untouched.
    assert single_store_defs.resolve_job_def("ingest_job").partitions_def != (
        defs.resolve_job_def("ingest_job").partitions_def
    )


def test_the_shard_sensor_asks_for_the_shards_whose_files_changed_and_runs_fill_them(
    sharded,
) -> None:
    defs, data, users = sharded
    sensor = next(s for s in defs.sensors if s.name == "shard_workspace_sensor")
    memory = defs.resources["memory"]
    with dg.instance_for_test() as instance:
        first = sensor(dg.build_sensor_context(instance=instance, resources={"memory": memory}))
        requested = sorted(r.partition_key for r in first.run_requests)
        assert requested == [shard_key(s) for s in range(SHARDS)]  # every shard has files
        assert all(r.tags[SHARD_TAG] == r.partition_key for r in first.run_requests)
        again = sensor(
            dg.build_sensor_context(
                instance=instance, cursor=first.cursor, resources={"memory": memory}
            )
        )
        assert not again.run_requests
        # One user's conversation changes: only that user's shard runs.
        changed = data.parent / "ws" / "sessions" / f"conv-{users[4]}" / "2026-10-01.jsonl"
        changed.write_text(changed.read_text() + changed.read_text().splitlines()[0] + "\n")
        settle(changed.parent)
        later = sensor(
            dg.build_sensor_context(
                instance=instance, cursor=first.cursor, resources={"memory": memory}
            )
        )
        assert [r.partition_key for r in later.run_requests] == [
            shard_key(shard_of(f"user:{users[4]}", SHARDS))
        ]

        # A run of one shard builds that shard's store, with that shard's users only.
        shard = shard_of(f"user:{users[0]}", SHARDS)
        result = defs.resolve_job_def("ingest_job").execute_in_process(
            instance=instance, partition_key=shard_key(shard), tags={SHARD_TAG: shard_key(shard)}
        )
        assert result.success
        store = data / "shards" / f"{shard_key(shard)}.duckdb"
        with duckdb.connect(str(store), read_only=True) as con:
            owners = {
                row[0]
                for row in con.execute(
                    "SELECT DISTINCT conversation_id FROM chunks WHERE conversation_id IS NOT NULL"
                ).fetchall()
            }
        assert f"conv-{users[0]}" in owners
        for conversation in owners:
            user = conversation.removeprefix("conv-")
            assert conversation == "conv-shared" or shard_of(f"user:{user}", SHARDS) == shard
        assert not (data / "memory.duckdb").exists()  # the single store is not touched
        materialized = instance.get_latest_materialization_event(dg.AssetKey("chunks"))
        assert materialized.asset_materialization.partition == shard_key(shard)
        # The shard's conversations are summarized inside its run.
        with duckdb.connect(str(store), read_only=True) as con:
            summarized = {
                row[0]
                for row in con.execute("SELECT DISTINCT conversation_id FROM summaries").fetchall()
            }
        assert f"conv-{users[0]}" in summarized


def test_schedules_fan_out_one_run_per_shard_with_the_same_clock(sharded) -> None:
    defs, _, _ = sharded
    tick = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)
    with dg.instance_for_test() as instance:
        for name in ("full_sync_schedule", "decay_schedule"):
            schedule = next(s for s in defs.schedules if s.name == name)
            context = dg.build_schedule_context(
                instance=instance,
                scheduled_execution_time=tick,
                repository_def=defs.get_repository_def(),
            )
            requests = schedule.evaluate_tick(context).run_requests
            assert sorted(r.partition_key for r in requests) == [
                shard_key(s) for s in range(SHARDS)
            ]
            assert len({r.run_key for r in requests}) == SHARDS
            assert all(r.tags[SHARD_TAG] == r.partition_key for r in requests)
        decay = schedule.evaluate_tick(context).run_requests  # the last one: decay
        assert json.dumps(decay[0].run_config).count(tick.isoformat()) == 1
