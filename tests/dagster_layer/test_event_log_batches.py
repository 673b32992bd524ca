"""The instance's event log stores a run's batch of per-partition materializations at once,
and what it stores reads back as Dagster's own SQLite event log would have stored it."""

import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from memory_dag.cli.main import EVENT_BATCH_ENV
from memory_dag.dagster_event_log import BatchedSqliteEventLogStorage, open_instance

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = [f"conv-{n:03d}" for n in range(12)]

parts = dg.StaticPartitionsDefinition(PARTITIONS)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.asset(partitions_def=parts, backfill_policy=dg.BackfillPolicy.single_run())
    def summaries(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """One step for every partition of its run, as the summaries asset is."""
        return dg.MaterializeResult(metadata={"partitions": len(context.partition_keys)})


@pytest.fixture
def commits() -> Iterator[list[str]]:
    """The database of every SQLite commit made while the test runs."""
    seen: list[str] = []

    def count(connection: sqlalchemy.engine.Connection) -> None:
        seen.append(str(connection.engine.url.database))

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "commit", count)
    yield seen
    sqlalchemy.event.remove(sqlalchemy.engine.Engine, "commit", count)


def _materialize_every_partition(home: Path, monkeypatch: pytest.MonkeyPatch) -> dg.DagsterInstance:
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv(*EVENT_BATCH_ENV)
    instance = dg.DagsterInstance.get()
    result = dg.materialize(
        [summaries],
        instance=instance,
        tags={  # every partition in one run, as an ingest run asks for its conversations
            "dagster/asset_partition_range_start": PARTITIONS[0],
            "dagster/asset_partition_range_end": PARTITIONS[-1],
        },
    )
    assert result.success
    return instance


def _home(tmp_path: Path, name: str, yaml: Path) -> Path:
    home = tmp_path / name
    home.mkdir()
    shutil.copy(yaml, home / "dagster.yaml")
    return home


def _plain_home(tmp_path: Path) -> Path:
    """A home on Dagster's own SQLite event log."""
    plain_yaml = tmp_path / "plain.yaml"
    plain_yaml.write_text("telemetry:\n  enabled: false\n")
    return _home(tmp_path, "plain", plain_yaml)


def test_the_projects_instance_stores_a_steps_partitions_in_one_transaction_a_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commits: list[str]
) -> None:
    home = _home(tmp_path, "project", REPO_ROOT / "data" / "dagster_home" / "dagster.yaml")
    instance = _materialize_every_partition(home, monkeypatch)
    batched_commits = len(commits)
    assert isinstance(instance.event_log_storage, BatchedSqliteEventLogStorage)
    # Where Dagster's default SQLite event log keeps its files.
    assert Path(instance.event_log_storage._base_dir) == home / "history" / "runs"
    assert instance.get_materialized_partitions(summaries.key) == set(PARTITIONS)

    commits.clear()
    _materialize_every_partition(_plain_home(tmp_path), monkeypatch)
    # Event by event, each materialization commits in the run's database and in the index
    # database; as a batch, the 12 commit once in each: 2 x 11 commits fewer. Every other
    # event of the run commits as before.
    assert len(commits) - batched_commits == 2 * (len(PARTITIONS) - 1)


def test_a_batch_reads_back_as_dagsters_own_sqlite_event_log_stores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched = _materialize_every_partition(
        _home(tmp_path, "batched", REPO_ROOT / "data" / "dagster_home" / "dagster.yaml"),
        monkeypatch,
    )
    plain = _materialize_every_partition(_plain_home(tmp_path), monkeypatch)
    assert type(plain.event_log_storage) is SqliteEventLogStorage

    def seen(instance: dg.DagsterInstance) -> dict[str, object]:
        records = instance.fetch_materializations(summaries.key, limit=100).records
        latest = instance.get_latest_materialization_event(summaries.key)
        status = instance.get_status_by_partition(summaries.key, PARTITIONS, parts)
        return {
            "partitions": sorted(r.partition_key or "" for r in records),
            "in_order": [r.partition_key for r in reversed(records)],
            "latest": latest.dagster_event.partition if latest and latest.dagster_event else None,
            "materialized": instance.get_materialized_partitions(summaries.key),
            "status": status,
            "asset_known": instance.has_asset_key(summaries.key),
            # The asset's row points at the newest record by its storage id.
            "row_is_newest": instance.get_asset_records([summaries.key])[
                0
            ].asset_entry.last_materialization_record.storage_id
            == records[0].storage_id,
        }

    assert seen(batched) == seen(plain)
    # The asset's row holds the batch's last event (the order Dagster emitted them in).
    assert seen(batched)["latest"] == seen(batched)["in_order"][-1]
    assert seen(batched)["partitions"] == PARTITIONS
    assert seen(batched)["row_is_newest"]


def test_a_batch_of_mixed_runs_is_stored_event_by_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, "project", REPO_ROOT / "data" / "dagster_home" / "dagster.yaml")
    instance = _materialize_every_partition(home, monkeypatch)
    storage = instance.event_log_storage
    first = storage.fetch_materializations(summaries.key, limit=2).records
    # The same two events as if from two runs: no single run's database to write them in.
    events = [record.event_log_entry._replace(run_id=f"run-{n}") for n, record in enumerate(first)]
    storage.store_event_batch(events)
    for n in range(2):
        assert len(storage.get_logs_for_run(f"run-{n}")) == 1
    assert storage.fetch_materializations(summaries.key, limit=100).records[0].run_id == "run-1"


def test_without_dagster_home_the_event_log_says_where_it_would_have_lived(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(ValueError, match="DAGSTER_HOME is not set"):
        BatchedSqliteEventLogStorage.from_config_value(None, {})


def test_open_instance_loads_a_home_as_dagster_home_would_and_leaves_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    home = _home(tmp_path, "project", REPO_ROOT / "data" / "dagster_home" / "dagster.yaml")
    instance = open_instance(home)
    assert Path(instance.event_log_storage._base_dir) == home / "history" / "runs"
    assert "DAGSTER_HOME" not in os.environ
