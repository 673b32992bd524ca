"""A run with nothing to do (issue 15): the first step decides, Dagster skips the rest.

Real Dagster runs of `ingest_job` on a real store: after a whole run, a run over the same
workspace executes only the files step, skips every other step and changes no table; a new
file, a live write, a stage run alone or a run that crashed half-way still gets everything
through the next run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from assets.checks import INGEST_CHECKS
from assets.ingest import INGEST_ASSETS
from assets.summaries import conversations as PARTITIONS
from memory_dag import Memory
from memory_dag.cli.instance_findings import FINDINGS_FILE
from memory_dag.config import Settings
from memory_dag.definitions import defs
from memory_dag.graph_state import NOTHING_DUE, work_due
from memory_dag.index.published import current_version
from memory_dag.index.search import search
from memory_dag.memories import write_path
from tests.conftest import write_jsonl
from tests.dagster_layer.test_ingest_assets import resource_for, use_env
from tests.store_snapshot import store_tables


@pytest.fixture
def instance(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    use_env(monkeypatch, settings)
    with dg.instance_for_test() as instance:
        yield instance


def run_ingest(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def("ingest_job").execute_in_process(instance=instance)
    assert result.success
    return result


def steps(result: dg.ExecuteInProcessResult, event: str) -> set[str]:
    return {e.step_key for e in result.all_events if e.event_type_value == event and e.step_key}


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {
        e.materialization.asset_key.to_user_string()
        for e in result.get_asset_materialization_events()
    }


def new_session(settings: Settings, text: str) -> None:
    write_jsonl(
        settings.workspace / "sessions" / "conv-a" / "s7.jsonl",
        [{"role": "user", "name": "Dana", "content": text, "id": "n1"}],
    )


def found(settings: Settings, query: str, conversation: str = "conv-a") -> list[str]:
    hits = search(query, settings=settings, k=5, min_score=0.0, conversation=conversation)
    return [hit.snippet for hit in hits]


def test_a_run_with_nothing_changed_executes_only_the_files_step(
    settings: Settings, instance: dg.DagsterInstance
) -> None:
    first = run_ingest(instance)
    assert {"facts", "entities", "search_index", "chunks_fts"} <= materialized(first)
    tables = store_tables(settings.db_path)
    version = current_version(settings.index_dir)

    second = run_ingest(instance)

    assert steps(second, "STEP_START") == {"workspace_files"}
    assert {"chunks", "facts", "entities", "chunk_embeddings", "indexes"} <= steps(
        second, "STEP_SKIPPED"
    )
    assert materialized(second) == set()
    [observed] = [e for e in second.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    metadata = observed.asset_observation_data.asset_observation.metadata
    assert metadata["changed"].value == metadata["new"].value == 0
    assert NOTHING_DUE in metadata["notes"].value
    assert store_tables(settings.db_path) == tables
    assert current_version(settings.index_dir) == version


def test_a_new_file_after_a_skipped_run_flows_through_every_stage(
    settings: Settings, instance: dg.DagsterInstance
) -> None:
    run_ingest(instance)
    run_ingest(instance)  # skipped
    new_session(settings, "My brother Tomasz moved to Lisbon last spring.")

    third = run_ingest(instance)

    assert {"workspace_files", "chunks", "facts", "entities", "search_index"} <= materialized(third)
    assert any("Lisbon" in snippet for snippet in found(settings, "Tomasz Lisbon"))
    assert not work_due(settings)  # settled again: the run after it does nothing
    assert steps(run_ingest(instance), "STEP_START") == {"workspace_files"}


def test_a_live_write_alone_makes_the_next_run_fold_it(
    settings: Settings, instance: dg.DagsterInstance
) -> None:
    run_ingest(instance)
    Memory(settings).add(
        [{"role": "user", "content": "I switched to decaf coffee."}],
        user_id="dana",
        conversation_id="conv-a",
    )
    assert work_due(settings).reasons == ["live writes wait in the journal"]

    result = run_ingest(instance)

    assert "facts" in materialized(result)
    facts = result.asset_materializations_for_node("facts")[0].metadata
    assert facts["live_calls_folded"].value > 0
    assert not work_due(settings)


def test_a_stage_run_alone_does_not_settle_and_the_next_run_catches_up(
    settings: Settings, instance: dg.DagsterInstance
) -> None:
    """A UI click on two assets: the new file is read and chunked, nothing else. The next
    whole run must not take the store for settled."""
    run_ingest(instance)
    new_session(settings, "Our cat Miso learned to open the fridge.")
    partial = dg.materialize(
        [*INGEST_ASSETS, *INGEST_CHECKS[:1]],
        resources={"memory": resource_for(settings)},
        instance=instance,
    )
    assert partial.success
    assert work_due(settings)

    result = run_ingest(instance)

    assert {"facts", "search_index"} <= materialized(result)
    assert any("fridge" in snippet for snippet in found(settings, "Miso fridge"))


def test_a_run_that_crashed_half_way_is_finished_by_the_next(
    settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_ingest(instance)
    new_session(settings, "The team offsite moved to Porto in June.")

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed mid-run")

    with monkeypatch.context() as patch:
        patch.setattr(write_path, "consolidate", crash)
        crashed = defs.resolve_job_def("ingest_job").execute_in_process(
            instance=instance, raise_on_error=False
        )
    assert not crashed.success
    assert "indexes" not in steps(crashed, "STEP_START")

    result = run_ingest(instance)

    assert {"facts", "search_index"} <= materialized(result)
    assert any("Porto" in snippet for snippet in found(settings, "offsite Porto"))


def test_the_library_pipeline_skips_the_same_way(settings: Settings) -> None:
    from memory_dag.pipeline import run_all

    run_all(settings)
    reports = run_all(settings)

    assert [r.stage for r in reports] == ["files"]
    assert NOTHING_DUE in reports[0].notes
    new_session(settings, "Grandma's recipe needs cardamom.")
    assert "chunks" in [r.stage for r in run_all(settings)]
    assert any("cardamom" in snippet for snippet in found(settings, "recipe cardamom"))


def test_settled_state_survives_a_deleted_index(
    settings: Settings, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    """The published index is part of what the graph settled on: without it, a run rebuilds."""
    import shutil

    run_ingest(instance)
    shutil.rmtree(settings.index_dir)

    result = run_ingest(instance)

    assert "search_index" in materialized(result)
    assert current_version(settings.index_dir) is not None


def test_memory_dag_ingest_launches_no_run_when_nothing_is_due(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI's own scan finds nothing due: no run is launched (as a sensor skips its tick);
    the run that settled the store already told the instance, so Dagster is not loaded. A
    store that settled without the CLI knowing (the note gone) gets its finding recorded once,
    as a runless observation of `workspace_files`. A touched file (same bytes, new mtime) brings
    a files-only run that records its new stat; a new file afterwards goes through every stage
    again."""
    import json
    import os
    import shutil

    from memory_dag.cli.main import main

    home = tmp_path / "dagster_home"
    home.mkdir()
    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "data" / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    paths = ["--workspace", str(settings.workspace), "--db", str(settings.db_path)]
    command = ["ingest", *paths, "--index-dir", str(settings.index_dir), "--json"]

    def ingest() -> dict:
        capsys.readouterr()
        assert main(command) == 0
        return json.loads(capsys.readouterr().out)

    ingest()
    tables = store_tables(settings.db_path)
    with dg.DagsterInstance.get() as instance:
        runs_before = len(instance.get_runs())
        # One "planned" event for the summaries of every conversation, not one a partition.
        planned = instance.get_records_for_run(
            instance.get_runs()[0].run_id,
            of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
        ).records
        [summaries] = [
            r.event_log_entry.dagster_event.asset_materialization_planned_data
            for r in planned
            if r.event_log_entry.dagster_event.asset_key == dg.AssetKey("conversation_summaries")
        ]
        conversations = set(instance.get_dynamic_partitions(PARTITIONS.name))
        assert {"conv-a", "conv-b"} <= conversations
        assert set(summaries.partitions_subset.get_partition_keys()) == conversations
    again = ingest()

    assert set(again["stages"]) == {"workspace_files"}
    assert NOTHING_DUE in again["stages"]["workspace_files"]["notes"]
    assert again["stages"]["workspace_files"]["files"] > 0
    assert again["stages"]["workspace_files"]["seconds"] >= 0
    assert again["stages"]["workspace_files"]["instance"] == "already recorded"
    assert store_tables(settings.db_path) == tables

    def observations() -> list:
        with dg.DagsterInstance.get() as instance:
            assert len(instance.get_runs()) == runs_before
            key = dg.AssetKey("workspace_files")
            return instance.fetch_observations(key, limit=10).records

    assert observations() == []  # the run's materializations are the instance's record
    (home / FINDINGS_FILE).unlink()  # as if a run from the UI had settled the store
    assert ingest()["stages"]["workspace_files"]["instance"] == "recorded"
    [observation] = observations()
    assert observation.asset_observation.metadata["notes"].value == NOTHING_DUE
    assert observation.run_id == ""  # runless
    assert ingest()["stages"]["workspace_files"]["instance"] == "already recorded"
    assert len(observations()) == 1

    touched = next((settings.workspace / "sessions").rglob("*.jsonl"))
    os.utime(touched, (touched.stat().st_atime, touched.stat().st_mtime - 10))
    ingest()
    with dg.DagsterInstance.get() as instance:
        assert len(instance.get_runs()) == runs_before + 1  # the files step records the stat
    after = store_tables(settings.db_path)
    assert {k: v for k, v in after.items() if k != "files"} == {
        k: v for k, v in tables.items() if k != "files"
    }
    assert after["files"] != tables["files"]  # the new mtime, nothing else
    assert set(ingest()["stages"]) == {"workspace_files"}
    with dg.DagsterInstance.get() as instance:
        assert len(instance.get_runs()) == runs_before + 1

    new_session(settings, "Dana's niece Ines starts school in Porto.")
    assert {"chunks", "facts", "search_index"} <= set(ingest()["stages"])
    assert any("Ines" in snippet for snippet in found(settings, "niece Ines school"))
