"""The maintenance schedules evaluated at fixed times, and the jobs run through Dagster."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from assets.maintenance import AS_OF_TAG, MAINTENANCE_ASSETS, MAINTENANCE_JOBS, decay
from assets.resources import MemoryStoreResource
from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.memories.writer import MemoryWriter, NewMemory
from memory_dag.store.connection import open_store
from schedules.crons import CRONS, TIMEZONE
from schedules.maintenance_jobs import MAINTENANCE_SCHEDULES, weekly_reflection_schedule

SUNDAY = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
DAILY = {
    "entity_enrichment_schedule": ("entity_enrichment_job", "maintenance__entity_enrichment"),
    "session_consolidation_schedule": (
        "session_consolidation_job",
        "maintenance__session_consolidation",
    ),
    "dedup_merge_schedule": ("dedup_merge_job", "maintenance__dedup_merge"),
    "decay_schedule": ("decay_job", "maintenance__decay"),
    "lifecycle_schedule": ("lifecycle_job", "maintenance__lifecycle"),
    "insights_schedule": ("insights_job", "maintenance__insights"),
}


def resource_for(settings: Settings) -> MemoryStoreResource:
    return MemoryStoreResource(
        workspace=str(settings.workspace),
        db_path=str(settings.db_path),
        index_dir=str(settings.index_dir),
    )


def definitions(settings: Settings) -> dg.Definitions:
    return dg.Definitions(
        assets=MAINTENANCE_ASSETS,
        jobs=MAINTENANCE_JOBS,
        schedules=MAINTENANCE_SCHEDULES,
        resources={"memory": resource_for(settings)},
    )


def test_definitions_load_with_every_schedule_on_its_cron(settings: Settings) -> None:
    defs = definitions(settings)
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    crons = {
        schedule.name: (schedule.cron_schedule, schedule.execution_timezone)
        for schedule in repository.schedule_defs
    }
    assert crons == {
        "entity_enrichment_schedule": ("0 2 * * *", TIMEZONE),
        "session_consolidation_schedule": ("0 3 * * *", TIMEZONE),
        "dedup_merge_schedule": ("30 3 * * *", TIMEZONE),
        "decay_schedule": ("0 4 * * *", TIMEZONE),
        "lifecycle_schedule": ("30 4 * * *", TIMEZONE),
        "weekly_reflection_schedule": ("0 3 * * 0", TIMEZONE),
        "insights_schedule": (CRONS["insights"], TIMEZONE),
    }
    for asset in MAINTENANCE_ASSETS:
        assert asset.op.pool == "duckdb", asset.key
        assert asset.group_names_by_key[asset.key] == "maintenance"


@pytest.mark.parametrize("name", sorted(DAILY))
def test_daily_schedules_request_one_run_per_tick_with_the_tick_as_clock(name: str) -> None:
    schedule = next(s for s in MAINTENANCE_SCHEDULES if s.name == name)
    tick = datetime(2026, 3, 3, 4, 0, tzinfo=UTC)
    job_name, op_name = DAILY[name]

    requests = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=tick))

    assert schedule.job_name == job_name
    (request,) = requests.run_requests
    assert request.run_config == {"ops": {op_name: {"config": {"as_of": tick.isoformat()}}}}
    assert request.tags[AS_OF_TAG] == tick.isoformat()
    next_day = schedule.evaluate_tick(
        dg.build_schedule_context(scheduled_execution_time=tick + timedelta(days=1))
    ).run_requests[0]
    assert request.run_key != next_day.run_key


def test_the_timezone_of_every_schedule_is_configurable() -> None:
    code = (
        "from schedules.maintenance_jobs import MAINTENANCE_SCHEDULES as s;"
        "print(sorted({x.execution_timezone for x in s}))"
    )
    env = {**os.environ, "MEMORY_DAG_TIMEZONE": "Europe/Lisbon"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['Europe/Lisbon']"


def test_reflection_runs_on_sundays_only() -> None:
    with dg.instance_for_test() as instance:
        sunday = weekly_reflection_schedule.evaluate_tick(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=SUNDAY)
        )
        monday = weekly_reflection_schedule.evaluate_tick(
            dg.build_schedule_context(
                instance=instance, scheduled_execution_time=SUNDAY + timedelta(days=1)
            )
        )
    assert len(sunday.run_requests) == 1
    assert sunday.run_requests[0].run_config == {
        "ops": {"maintenance__weekly_reflection": {"config": {"as_of": SUNDAY.isoformat()}}}
    }
    assert monday.run_requests == [] and "Sundays" in monday.skip_message


def test_reflection_runs_at_most_once_per_six_days(settings: Settings) -> None:
    reflection_job = definitions(settings).resolve_job_def("reflection_job")
    tuesday = SUNDAY + timedelta(days=2)
    with dg.instance_for_test() as instance:
        # A reflection run by hand on Tuesday, with its clock in the run's tags.
        manual = reflection_job.execute_in_process(
            instance=instance,
            run_config={
                "ops": {
                    "maintenance__weekly_reflection": {"config": {"as_of": tuesday.isoformat()}}
                }
            },
            tags={AS_OF_TAG: tuesday.isoformat()},
        )
        assert manual.success

        five_days_later = weekly_reflection_schedule.evaluate_tick(
            dg.build_schedule_context(
                instance=instance, scheduled_execution_time=SUNDAY + timedelta(days=7)
            )
        )
        assert five_days_later.run_requests == []
        assert "under 6 days ago" in five_days_later.skip_message

        two_weeks = SUNDAY + timedelta(days=14)
        due = weekly_reflection_schedule.evaluate_tick(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=two_weeks)
        )
        (request,) = due.run_requests
        # The request runs as is, and then counts as the last reflection.
        run = reflection_job.execute_in_process(
            instance=instance, run_config=request.run_config, tags=request.tags
        )
        assert run.success
        a_week_later = weekly_reflection_schedule.evaluate_tick(
            dg.build_schedule_context(
                instance=instance, scheduled_execution_time=two_weeks + timedelta(days=7)
            )
        )
        assert len(a_week_later.run_requests) == 1


def add_fact(settings: Settings, text: str, at: datetime | None = None) -> str:
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor="test", now=at)
        with writer.transaction():
            return writer.add(NewMemory(content=text, conversation_id="conv-a"))


def test_the_nightly_assets_materialize_over_a_store_with_metadata(settings: Settings) -> None:
    sync_files(settings)
    build_chunks(settings)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            MAINTENANCE_ASSETS, resources={"memory": resource_for(settings)}, instance=instance
        )
        assert result.success
        metadata = {
            e.materialization.asset_key.to_user_string(): e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
    assert set(metadata) == {a.key.to_user_string() for a in MAINTENANCE_ASSETS}
    for values in metadata.values():
        for count in ("examined", "merged", "decayed", "soft_deleted", "purged", "created"):
            assert count in values
        assert values["seconds"].value >= 0
    assert metadata["maintenance/session_consolidation"]["created"].value >= 2
    assert metadata["maintenance/entity_enrichment"]["skipped"].value is True
    assert metadata["maintenance/insights"]["skipped"].value is True
    # the consolidated facts are this week's, but under 3 per conversation: no reflection
    reflection = metadata["maintenance/weekly_reflection"]
    assert reflection["examined"].value >= 1 and reflection["created"].value == 0
    assert "facts this week" in reflection["notes"].value


def test_a_decay_run_with_a_scheduled_clock_soft_deletes_a_stale_fact(settings: Settings) -> None:
    written = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a fixed clock: days are counted
    fact = add_fact(settings, "The user's sister Priya lives in Toronto.", at=written)
    as_of = written + timedelta(days=40)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [decay],
            resources={"memory": resource_for(settings)},
            instance=instance,
            run_config={"ops": {"maintenance__decay": {"config": {"as_of": as_of.isoformat()}}}},
        )
        assert result.success
        (event,) = result.get_asset_materialization_events()
        assert event.materialization.metadata["soft_deleted"].value == 1
    with open_store(settings.db_path) as con:
        state, valid_until = con.execute(
            "SELECT state, valid_until FROM memories WHERE id = ?", [fact]
        ).fetchone()
    assert state == "soft_deleted" and valid_until == as_of
