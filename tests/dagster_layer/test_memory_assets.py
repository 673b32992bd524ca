"""The write path as Dagster runs it: the sessions sensor asks, `ingest_job`'s assets answer."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from assets.jobs import FIRST_STAGES as INGEST_ASSETS
from assets.jobs import ingest_job
from assets.memories import MEMORY_ASSETS as WRITE_PATH_ASSETS
from assets.resources import MemoryStoreResource
from assets.summaries import SUMMARY_ASSETS
from memory_dag.config import Settings
from memory_dag.eval.locomo import write_workspace
from memory_dag.index.search import search
from sensors.sessions import sessions_sensor
from tests.conftest import LOCOMO_DIR, write_jsonl
from tests.dagster_layer.test_ingest_assets import age_files, resource_for
from tests.memories.test_write_path import DEMO, pizza_workspace, rows, store_settings, turn

LOCOMO = LOCOMO_DIR


def materialize(settings: Settings) -> dict[str, dict[str, dg.MetadataValue]]:
    """What an `ingest_job` run does; returns each asset's materialization metadata."""
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [*INGEST_ASSETS, *WRITE_PATH_ASSETS],
            resources={"memory": resource_for(settings)},
            instance=instance,
        )
        assert result.success
        return {
            e.materialization.asset_key.to_user_string(): dict(e.materialization.metadata)
            for e in result.get_asset_materialization_events()
        }


def test_definitions_wire_the_write_path_into_the_graph() -> None:
    defs = dg.Definitions(
        assets=[*INGEST_ASSETS, *WRITE_PATH_ASSETS, *SUMMARY_ASSETS],
        jobs=[ingest_job],
        sensors=[sessions_sensor],
        resources={"memory": MemoryStoreResource()},
    )
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    facts = dg.AssetKey("facts")
    for name in ("chunk_embeddings", "search_index"):  # facts are embedded and indexed after
        assert facts in graph.get(dg.AssetKey(name)).parent_keys
    assert graph.get(dg.AssetKey("entities")).parent_keys >= {facts}
    for asset in WRITE_PATH_ASSETS:
        assert asset.op.pool == "duckdb", asset.key
        assert asset.group_names_by_key[asset.key] == "memory"
    job_assets = defs.resolve_job_def(ingest_job.name).asset_layer.executable_asset_keys
    assert {"workspace_files", "facts", "entities", "search_index"} <= {
        key.to_user_string() for key in job_assets
    }


def test_sensor_requests_a_run_when_a_session_closes_and_the_run_writes_facts(
    tmp_path: Path,
) -> None:
    workspace = pizza_workspace(tmp_path / "ws")
    (workspace / "sessions" / DEMO / "s3.jsonl").unlink()  # s2 is the live session for now
    settings = store_settings(tmp_path, workspace)
    age_files(workspace)

    def evaluate(cursor: str | None) -> dg.SensorResult:
        with dg.instance_for_test() as instance:  # where the summary partitions are
            context = dg.build_sensor_context(
                cursor=cursor, instance=instance, resources={"memory": resource_for(settings)}
            )
            return sessions_sensor(context)

    first = evaluate(None)
    [request] = first.run_requests
    assert request.run_key.startswith("sessions-")
    assert request.tags["memory_dag/conversations"] == DEMO
    quiet = evaluate(first.cursor)
    assert quiet.run_requests == []
    assert not settings.db_path.exists()  # the sensor never touches DuckDB

    metadata = materialize(settings)  # the requested run
    facts = metadata["facts"]
    assert facts["method"].value == "rules"
    assert facts["sessions_consolidated"].value == 1  # s1; s2 is still open...
    assert facts["sessions_observed"].value == 1  # ...and its turns are examined as they came
    assert facts["facts_added"].value == 3 and facts["facts_deleted"].value == 1
    assert {"extract_wait_seconds", "reconcile_seconds", "write_seconds"} <= set(facts)
    active = [f["content"] for f in rows(settings, "SELECT content FROM facts ORDER BY event_time")]
    assert active == ["Sam now hates pizza.", "Sam's wife is named Anne."]

    write_jsonl(
        workspace / "sessions" / DEMO / "s3.jsonl",
        [turn("c1", "Hi again.", "2024-03-01T10:00:00Z")],
    )
    age_files(workspace)
    started = evaluate(quiet.cursor)
    [second] = started.run_requests
    assert second.run_key != request.run_key

    closing = materialize(settings)["facts"]
    assert closing["sessions_consolidated"].value == 1 and closing["turns_examined"].value == 1
    active = [f["content"] for f in rows(settings, "SELECT content FROM facts ORDER BY event_time")]
    assert active == ["Sam now hates pizza.", "Sam's wife is named Anne."]
    hits = search("What does Sam think of pizza?", settings=settings, kind="fact", min_score=0.0)
    assert hits[0].snippet == "Sam now hates pizza."  # indexed in the same run


def test_a_locomo_conversation_fills_facts_and_entities_traceable_to_turns(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    write_workspace([LOCOMO / "30.json"], workspace)
    settings = store_settings(tmp_path, workspace)

    metadata = materialize(settings)

    facts = metadata["facts"]
    assert facts["method"].value == "rules"
    assert facts["turns_examined"].value > 300
    assert facts["facts_added"].value >= 10
    assert facts["facts_active"].value == len(rows(settings, "SELECT id FROM facts"))
    assert facts["write_seconds"].value > 0
    entities = metadata["entities"]
    assert entities["memories_linked"].value >= 369  # every turn, and the facts
    assert entities["entities"].value >= 20

    written = rows(
        settings,
        "SELECT f.id, f.session_id, f.event_time, f.speaker, e.session_id AS turn_session, "
        "e.event_time AS turn_time, e.speaker AS turn_speaker, e.role, e.conversation_id "
        "FROM memories f LEFT JOIN episodes e ON e.id = f.source_ids[1] WHERE f.kind = 'fact'",
    )
    assert len(written) >= 10
    for fact in written:
        assert fact["conversation_id"] == "locomo-30" and fact["role"] == "user", fact
        assert fact["turn_session"] == fact["session_id"], fact
        assert fact["turn_time"] == fact["event_time"] and fact["turn_speaker"] == fact["speaker"]
    speakers = rows(
        settings,
        "SELECT f.id, list(e.canonical_name) FILTER (WHERE e.type = 'person') AS people "
        "FROM memories f LEFT JOIN memory_entities l ON l.memory_id = f.id "
        "LEFT JOIN entities e ON e.id = l.entity_id WHERE f.kind = 'fact' GROUP BY f.id",
    )
    speaker_of = {fact["id"]: fact["speaker"] for fact in written}
    for fact in speakers:  # every fact is linked to the person who said it
        assert speaker_of[fact["id"]] in fact["people"], fact
    indexed = search("dance studio", settings=settings, kind="fact", min_score=0.0)
    assert indexed and all(hit.kind == "fact" for hit in indexed)
