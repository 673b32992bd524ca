"""Four clients writing and reading through the service while a Dagster run ingests: no
errors, no lost writes, and the next run folds every live write into the store exactly once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from assets.jobs import PIPELINE_ASSETS
from memory_dag.config import Settings
from memory_dag.memory import Memory
from memory_dag.service.app import ServiceConfig, create_app
from memory_dag.store.connection import open_store
from tests.dagster_layer.test_ingest_assets import resource_for
from tests.service.conftest import PLANNER, Served, write_keys
from tests.service.server import running

CLIENTS = 4
#: Each client writes at least this many memories, and keeps writing until the run ends.
LEAST_WRITES = 5
#: Distinct words, so no write is a near-duplicate of another one (which `add` would skip).
THINGS = [
    "violin",
    "kayak",
    "telescope",
    "sourdough",
    "chess",
    "orchid",
    "marathon",
    "pottery",
    "falconry",
    "origami",
    "beekeeping",
    "fencing",
    "calligraphy",
    "astronomy",
    "karaoke",
    "archery",
    "juggling",
    "sailing",
    "ceramics",
    "knitting",
    "robotics",
    "surfing",
    "gliding",
    "weaving",
    "tango",
    "rowing",
    "bonsai",
    "climbing",
    "welding",
    "opera",
]


@pytest.fixture
def busy_service(settings: Settings, tmp_path: Path) -> Iterator[Served]:
    memory = Memory(settings)
    config = ServiceConfig(api_keys_file=write_keys(tmp_path))
    with running(create_app(memory, config)) as url:
        yield Served(url, memory, None, Path(settings.workspace).parent)  # type: ignore[arg-type]


def test_clients_during_a_dagster_run_lose_nothing(
    busy_service: Served, settings: Settings
) -> None:
    run_done = threading.Event()
    errors: list[str] = []
    written: dict[str, tuple[str, str]] = {}  # memory id -> (user, text)
    lock = threading.Lock()

    def client(number: int) -> None:
        user = f"user{number}"
        http = busy_service.client(PLANNER)
        count = 0
        try:
            while count < LEAST_WRITES or not run_done.is_set():
                thing = THINGS[count % len(THINGS)]
                text = f"{user.capitalize()} must practise {thing} for project {number}-{count}."
                body = {"text": text, "user_id": user, "category": "tasks"}
                answer = http.post("/v1/memories", json=body)
                if answer.status_code != 201:
                    errors.append(f"{user} add {answer.status_code}: {answer.text}")
                    return
                event = answer.json()["results"][0]
                with lock:
                    written[event["id"]] = (user, event["memory"])
                asked = {"query": text, "user_id": user, "min_score": 0.0, "limit": 20}
                found = http.post("/v1/memories/search", json=asked)
                if found.status_code != 200:
                    errors.append(f"{user} search {found.status_code}: {found.text}")
                    return
                results = found.json()["results"]
                if event["id"] not in [r["id"] for r in results]:
                    errors.append(f"{user}: {event['id']} not found right after it was written")
                if any(r["user_id"] not in (None, user) for r in results):
                    errors.append(f"{user} read another user's memory")
                count += 1
        except Exception as failure:  # noqa: BLE001 - every failure is counted, then asserted
            errors.append(f"{user}: {failure!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                PIPELINE_ASSETS, resources={"memory": resource_for(settings)}, instance=instance
            )
    finally:
        run_done.set()
        for thread in threads:
            thread.join(timeout=300)
    assert result.success
    assert errors == []
    assert len(written) >= CLIENTS * LEAST_WRITES

    # Nothing lost: every write is readable, by its owner only.
    memory = Memory(settings)
    for memory_id, (user, text) in written.items():
        item = memory.get(memory_id, user_id=user, agent_id="planner")
        assert item is not None and item.memory == text and item.state == "active"

    # The next run folds every live write into the store, each exactly once.
    with dg.instance_for_test() as instance:
        again = dg.materialize(
            PIPELINE_ASSETS, resources={"memory": resource_for(settings)}, instance=instance
        )
    assert again.success
    with open_store(settings.db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT id, user_id, content, count(*) OVER (PARTITION BY id) FROM memories "
            "WHERE kind = 'fact' AND id IN (SELECT unnest(?))",
            [list(written)],
        ).fetchall()
    assert {row[0]: (row[1], row[2]) for row in rows} == written
    assert all(row[3] == 1 for row in rows)
    for memory_id, (user, text) in list(written.items())[:5]:  # still found, now from the index
        found = memory.search(text, user_id=user, agent_id="planner", min_score=0.0, limit=20)
        assert memory_id in [r.id for r in found.results]
