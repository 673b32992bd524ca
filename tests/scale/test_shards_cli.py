"""The command line on a sharded store: ingest every shard, route by --user, re-shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_dag.cli.main import main
from memory_dag.store.shards import SHARDS_ENV, shard_of
from tests.scale.corpus import built_shards, write_corpus


def test_cli_ingests_every_shard_routes_by_user_and_reshards(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv(SHARDS_ENV, "4")
    workspace = tmp_path / "ws"
    write_corpus(workspace, users=6)
    db = tmp_path / "data" / "memory.duckdb"
    flags = ["--workspace", str(workspace), "--db", str(db)]
    assert main(["ingest", "--no-dagster", "--json", *flags]) == 0
    capsys.readouterr()
    assert main(["shards", "--json", *flags]) == 0
    shards = json.loads(capsys.readouterr().out)
    assert [row["exists"] for row in shards] == [True] * 4

    def search(user: str, text: str) -> list[dict]:
        code = main(
            ["search", text, "--json", "--user", user, "--conversation", f"conv-{user}", *flags]
        )
        assert code == 0
        return json.loads(capsys.readouterr().out)["results"]

    # user001 talks about pizza, user002 about chess; each is answered from its own shard.
    hits = search("user001", "pizza anchovies")
    assert hits and all(hit["conversation_id"] == "conv-user001" for hit in hits)
    assert shard_of("user:user001", 4) != shard_of("user:user004", 4)
    other = search("user004", "pizza anchovies")  # a shard without user001's rows
    assert other and all(hit["conversation_id"] == "conv-user004" for hit in other)
    assert not any("anchovies" in hit["memory"] for hit in other)
    # No user, no conversation: refused, never answered from every shard.
    assert main(["search", "pizza", *flags]) == 2
    assert "name a user" in capsys.readouterr().err

    assert main(["reshard", "--to", "2", *flags]) == 0
    capsys.readouterr()
    monkeypatch.setenv(SHARDS_ENV, "2")
    assert search("user001", "pizza anchovies")
    monkeypatch.setenv(SHARDS_ENV, "4")
    assert main(["search", "pizza", "--user", "user001", *flags]) == 2
    assert "reshard --to 4" in capsys.readouterr().err


def test_two_users_on_different_shards_are_routed_right_under_concurrent_reads(
    tmp_path: Path, monkeypatch
) -> None:
    """What a service in front of the library does per request: route by user, read the shard.
    Eight threads interleave two users' searches; every hit comes from the asker's own rows."""
    from concurrent.futures import ThreadPoolExecutor

    from memory_dag.index.search import search
    from memory_dag.scope import Scope
    from memory_dag.store.shards import settings_for

    monkeypatch.setenv(SHARDS_ENV, "4")
    settings = built_shards(tmp_path, 4, users=6)
    alice, bob = "user001", "user004"  # pizza and violin, on shards 2 and 3
    assert (
        settings_for(settings, user_id=alice).db_path != settings_for(settings, user_id=bob).db_path
    )

    def ask(number: int) -> tuple[str, list[str]]:
        user = (alice, bob)[number % 2]
        shard = settings_for(settings, user_id=user, conversation_id=f"conv-{user}")
        scope = Scope.of(user_id=user, conversation_id=f"conv-{user}")
        hits = search("what do I love", settings=shard, conversation=f"conv-{user}", scope=scope)
        return user, [str(hit.conversation_id) for hit in hits]

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, range(200)))
    assert all(paths for _, paths in answers)
    for user, conversations in answers:
        assert set(conversations) == {f"conv-{user}"}, (user, conversations)


def test_the_memory_api_routes_each_user_to_their_shard_under_concurrent_load(
    tmp_path: Path, monkeypatch
) -> None:
    """`Memory` (what `memory-dag serve` calls per request) reads each user's own shard."""
    from concurrent.futures import ThreadPoolExecutor

    from memory_dag.memory import Memory
    from memory_dag.store.shards import RouteRequired

    monkeypatch.setenv(SHARDS_ENV, "4")
    memory = Memory(built_shards(tmp_path, 4, users=6))
    alice, bob = "user001", "user004"  # shards 2 and 3
    assert memory.store(alice).db_path.name == "shard-02.duckdb"
    assert memory.store(bob).db_path.name == "shard-03.duckdb"

    def ask(number: int) -> tuple[str, set[str | None]]:
        user = (alice, bob)[number % 2]
        found = memory.search("pizza or violin", user_id=user, conversation_id=f"conv-{user}")
        return user, {result.conversation_id for result in found.results}

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, range(100)))
    for user, conversations in answers:
        assert conversations == {f"conv-{user}"}, (user, conversations)
    with pytest.raises(RouteRequired):
        memory.store(None)
