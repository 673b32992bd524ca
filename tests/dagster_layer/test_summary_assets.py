"""The summaries asset, its partitions and sensors, for real: a Dagster instance, DuckDB files
in tmp_path, a LoCoMo conversation on the embedded defaults, the scripted LLM server."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from assets.ingest import workspace_files
from assets.summaries import SUMMARY_ASSETS, SUMMARY_JOBS, conversation_summaries, conversations
from memory_dag.config import Settings
from memory_dag.definitions import defs as project_defs
from memory_dag.eval.locomo import write_workspace
from memory_dag.index.search import search
from memory_dag.store.connection import fetch_dicts, open_store
from memory_dag.summaries.conversation_summaries import final_summary
from sensors.conversations import SUMMARY_SENSORS, summaries_indexed_sensor
from sensors.workspace import workspace_sensor
from tests.conftest import LOCOMO_DIR, write_jsonl
from tests.dagster_layer.test_ingest_assets import age_files, resource_for
from tests.openai_server import Reply, ScriptedOpenAIServer
from tests.summaries.test_conversation_summaries import settings_in, write_conversation

LOCOMO = LOCOMO_DIR / "26.json"


def with_summaries(code_location: dg.Definitions) -> dg.Definitions:
    """The project's definitions with the summaries registered (as definitions.py will be)."""
    if code_location.get_repository_def().has_sensor_def("summaries_indexed_sensor"):
        return code_location
    summaries = dg.Definitions(assets=SUMMARY_ASSETS, jobs=SUMMARY_JOBS, sensors=SUMMARY_SENSORS)
    return dg.Definitions.merge(code_location, summaries)


defs = with_summaries(project_defs)


def metadata_of(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, object]]:
    return {
        e.materialization.asset_key.to_user_string(): {
            key: value.value for key, value in e.materialization.metadata.items()
        }
        for e in result.get_asset_materialization_events()
    }


def test_definitions_with_summaries_load() -> None:
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    assert repository.has_sensor_def("summaries_indexed_sensor")
    assert conversation_summaries.op.pool == "duckdb"
    assert conversation_summaries.partitions_def == conversations
    # One step summarizes every partition of its run (an ingest run, a backfill).
    assert conversation_summaries.backfill_policy == dg.BackfillPolicy.single_run()
    assert defs.resolve_job_def("summaries_job").partitions_def == conversations
    ingest = defs.resolve_job_def("ingest_job").asset_layer.executable_asset_keys
    assert conversation_summaries.key in ingest


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev data not available")
def test_a_locomo_conversation_is_summarized_indexed_and_searchable(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    write_workspace([LOCOMO], settings.workspace)
    resources = {"memory": resource_for(settings)}
    with dg.instance_for_test() as instance:
        assert dg.materialize([workspace_files], resources=resources, instance=instance).success
        instance.add_dynamic_partitions(conversations.name, ["locomo-26"])

        result = dg.materialize(
            [conversation_summaries, workspace_files],
            selection=[conversation_summaries],
            partition_key="locomo-26",
            resources=resources,
            instance=instance,
        )

        assert result.success
        meta = metadata_of(result)["conversation_summaries"]
        assert meta["level"] == "HIERARCHICAL" and meta["method"] == "extractive"
        assert meta["input_tokens"] > 15000 and meta["l2_summaries"] >= 2
        assert 0.02 <= meta["compression_ratio"] <= 0.05
        ratio = meta["output_tokens"] / meta["input_tokens"]
        assert meta["compression_ratio"] == pytest.approx(ratio, abs=1e-4)
        assert {"gather_seconds", "summarize_seconds", "write_seconds"} <= set(meta)
        [materialization] = result.get_asset_materialization_events()
        assert materialization.partition == "locomo-26"

        # The asset sensor asks for the embed + index job; running it makes summaries searchable.
        context = dg.build_sensor_context(instance=instance, definitions=defs)
        tick_data = summaries_indexed_sensor.evaluate_tick(context)
        [request] = tick_data.run_requests
        assert request.run_key == f"summary-index:{result.run_id}"
        assert summaries_indexed_sensor.job_name == "summary_index_job"
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, cursor=tick_data.cursor
        )
        assert summaries_indexed_sensor.evaluate_tick(context).run_requests == []
        job = defs.resolve_job_def("summary_index_job")
        assert job.execute_in_process(instance=instance, resources=resources).success

    final = final_summary("locomo-26", settings)
    assert final is not None and final.summary_level.value == "HIERARCHICAL"
    hits = search("adoption", settings=settings, kind="summary", conversation="locomo-26")
    assert hits and all(hit.kind == "summary" for hit in hits)
    with open_store(settings.db_path, read_only=True) as con:
        ids = {r["id"] for r in fetch_dicts(con, "SELECT id FROM summaries WHERE state = 'active'")}
    assert {hit.id for hit in hits} <= ids


def tick(instance: dg.DagsterInstance, cursor: str | None, settings: Settings) -> dg.SensorResult:
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"memory": resource_for(settings)}
    )
    result = workspace_sensor(context)
    for request in result.dynamic_partitions_requests or []:  # what the daemon does with them
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def summarized_range(result: dg.SensorResult) -> tuple[str, str] | None:
    """The conversation partitions the one requested ingest run summarizes (None: no summaries)."""
    [request] = result.run_requests
    if request.asset_selection is not None:
        assert conversation_summaries.key not in request.asset_selection
        return None
    return (
        request.tags["dagster/asset_partition_range_start"],
        request.tags["dagster/asset_partition_range_end"],
    )


def test_the_workspace_sensor_adds_partitions_and_asks_for_the_changed_conversations(
    settings: Settings,
) -> None:
    workspace = Path(settings.workspace)  # conv-a and conv-b sessions, entries/trip, notes
    age_files(workspace)
    with dg.instance_for_test() as instance:
        first = tick(instance, None, settings)
        [add] = first.dynamic_partitions_requests
        assert list(add.partition_keys) == ["conv-a", "conv-b", "trip"]
        assert summarized_range(first) == ("conv-a", "trip")
        assert instance.get_dynamic_partitions(conversations.name) == ["conv-a", "conv-b", "trip"]

        # One changed conversation: the run summarizes it alone.
        write_jsonl(
            workspace / "sessions" / "conv-b" / "s10.jsonl", [{"role": "user", "content": "Tea!"}]
        )
        age_files(workspace)
        second = tick(instance, first.cursor, settings)
        assert not second.dynamic_partitions_requests
        assert summarized_range(second) == ("conv-b", "conv-b")

        # Our own exported summaries and the notes are not a conversation's: no summaries.
        exported = workspace / "entries" / "trip" / "summaries" / "L3" / "final.md"
        exported.parent.mkdir(parents=True)
        exported.write_text("---\nrole: summary\n---\nA summary.\n")
        (workspace / "MEMORY.md").write_text("# Notes\n\nNew note.\n")
        age_files(workspace)
        third = tick(instance, second.cursor, settings)
        assert summarized_range(third) is None

        # A new conversation is added after the known ones; the range holds both changes.
        write_jsonl(
            workspace / "sessions" / "conv-0" / "s1.jsonl", [{"role": "user", "content": "Hi"}]
        )
        write_jsonl(
            workspace / "sessions" / "conv-a" / "s7.jsonl", [{"role": "user", "content": "Yo"}]
        )
        age_files(workspace)
        fourth = tick(instance, third.cursor, settings)
        assert list(fourth.dynamic_partitions_requests[0].partition_keys) == ["conv-0"]
        assert summarized_range(fourth) == ("conv-a", "conv-0")


def run_range(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    resources: dict[str, object],
    first: str,
    last: str,
    run_config: dict[str, object] | None = None,
) -> dg.ExecuteInProcessResult:
    """A run of `job` over the partitions first..last, as the sensors ask for one."""
    return job.execute_in_process(
        instance=instance,
        resources=resources,
        run_config=run_config,
        tags={
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
    )


def test_an_ingest_run_summarizes_its_conversations_in_one_step_and_indexes_them(
    settings: Settings,
) -> None:
    resources = {"memory": resource_for(settings)}
    job = defs.resolve_job_def("ingest_job")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(conversations.name, ["conv-a", "conv-b", "trip"])
        result = run_range(job, instance, resources, "conv-a", "trip")
        assert result.success
        steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
        assert "conversation_summaries" in steps  # one step for the three partitions
        summaries = [
            e
            for e in result.get_asset_materialization_events()
            if e.asset_key == conversation_summaries.key
        ]
        assert sorted(e.partition for e in summaries) == ["conv-a", "conv-b", "trip"]
        meta = summaries[0].materialization.metadata
        assert meta["conversations"].value == 3
        assert meta["summarized"].value + meta["too_short"].value == 3

        # The run embedded and indexed after the summaries: the index sensor has nothing to do.
        context = dg.build_sensor_context(instance=instance, definitions=defs)
        assert summaries_indexed_sensor.evaluate_tick(context).run_requests == []

        # Nothing changed: the run's files step skips every later step, the summaries too.
        skipped = run_range(job, instance, resources, "conv-b", "conv-b")
        assert not [
            e
            for e in skipped.get_asset_materialization_events()
            if e.asset_key == conversation_summaries.key
        ]
        # Asked to summarize again, the run does, for its one partition.
        again = run_range(
            job,
            instance,
            resources,
            "conv-b",
            "conv-b",
            {"ops": {"conversation_summaries": {"config": {"force": True}}}},
        )
        [summary] = [
            e
            for e in again.get_asset_materialization_events()
            if e.asset_key == conversation_summaries.key
        ]
        assert summary.partition == "conv-b"
        assert summary.materialization.metadata["conversations"].value == 1


def test_requested_partition_materializes_and_a_failure_keeps_the_summary(
    tmp_path: Path, openai_server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", 1500)
    resources = {"memory": resource_for(settings)}
    with dg.instance_for_test() as instance:
        assert dg.materialize([workspace_files], resources=resources, instance=instance).success
        instance.add_dynamic_partitions(conversations.name, ["c1"])
        job = defs.resolve_job_def("summaries_job")

        first = job.execute_in_process(instance=instance, resources=resources, partition_key="c1")
        assert metadata_of(first)["conversation_summaries"]["level"] == "STANDARD"
        before = final_summary("c1", settings)

        # Now with an LLM that refuses: the run fails, the failure is recorded, the summary stays.
        monkeypatch.setenv("MEMORY_DAG_LLM_BASE_URL", openai_server.base_url)
        monkeypatch.setenv("MEMORY_DAG_LLM_MODEL", "m")
        openai_server.push(Reply.status(400))
        failed = job.execute_in_process(
            instance=instance,
            resources=resources,
            partition_key="c1",
            run_config={"ops": {"conversation_summaries": {"config": {"force": True}}}},
            raise_on_error=False,
        )

        assert not failed.success
        [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "SummarizationError" in str(failure.event_specific_data.error)
    assert final_summary("c1", settings) == before
    with open_store(settings.db_path, read_only=True) as con:
        events = con.execute("SELECT status, detail FROM events ORDER BY ts").fetchall()
    assert [status for status, _ in events] == ["ok", "error"]
    assert "HTTP 400" in events[1][1]
    assert json.loads(json.dumps(openai_server.chat_requests[0]["body"]))["model"] == "m"
