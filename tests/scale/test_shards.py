"""Shards: the user → shard rule, routing a workspace, per-shard stores and re-sharding."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest

from memory_dag.config import Settings
from memory_dag.ingest.routing import look_at_shards, route_workspace
from memory_dag.pipeline import run_all
from memory_dag.store.reshard import reshard, row_digests
from memory_dag.store.shards import (
    SHARDS_ENV,
    RouteRequired,
    ShardLayoutError,
    all_shard_settings,
    read_routes,
    settings_for,
    shard_count,
    shard_of,
    shard_settings,
    write_layout,
)
from tests.scale.corpus import built_shards, write_corpus
from tests.scale.test_shard_assets import settle
from tests.store_snapshot import differences, store_tables


def test_the_rule_is_blake2b_of_the_key_mod_n_and_never_changes() -> None:
    # Pinned values: a change to the rule would move every user's rows.
    assert [shard_of(f"user:user{i:03d}", 8) for i in range(12)] == [
        1, 2, 2, 3, 7, 1, 7, 0, 1, 5, 6, 4,
    ]  # fmt: skip
    assert shard_of("user:alice", 8) == 7
    assert shard_of("user:bob", 8) == 1
    assert shard_of("user:alice", 3) == 0
    assert shard_of("anything", 1) == 0
    counts = [0] * 8
    for number in range(4000):
        counts[shard_of(f"user:{number}", 8)] += 1
    assert min(counts) > 400  # spread evenly (500 expected each)
    with pytest.raises(ValueError):
        shard_of("user:alice", 0)


def test_one_shard_is_the_single_store_unchanged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(SHARDS_ENV, raising=False)
    settings = Settings(workspace=tmp_path / "ws", db_path=tmp_path / "memory.duckdb")
    assert shard_count(settings) == 1
    assert settings_for(settings, user_id="alice") is settings
    assert shard_settings(settings, 0, 1) is settings
    assert route_workspace(settings).skipped
    assert not (tmp_path / "shards").exists()


def test_shard_paths_sit_beside_the_store_and_requests_need_a_user(
    tmp_path: Path, monkeypatch
) -> None:
    settings = Settings(workspace=tmp_path / "ws", db_path=tmp_path / "memory.duckdb")
    monkeypatch.setenv(SHARDS_ENV, "8")
    assert shard_count(settings) == 8
    alice = settings_for(settings, user_id="alice")
    assert alice.db_path == tmp_path / "shards" / "shard-07.duckdb"
    assert alice.index_dir == tmp_path / "shards" / "shard-07.index"
    assert settings_for(settings, user_id="bob").db_path.name == "shard-01.duckdb"
    with pytest.raises(RouteRequired, match="--user"):
        settings_for(settings)
    write_layout(settings, 4)
    with pytest.raises(ShardLayoutError, match="reshard --to 8"):
        shard_count(settings)
    monkeypatch.setenv(SHARDS_ENV, "zero")
    with pytest.raises(ShardLayoutError):
        shard_count(settings)


def _shard_files(settings: Settings, shards: int) -> list[set[str]]:
    return [
        {p.relative_to(s.workspace).as_posix() for p in Path(s.workspace).rglob("*") if p.is_file()}
        for s in all_shard_settings(settings, shards)
    ]


def test_routing_links_each_conversation_into_one_shard(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(SHARDS_ENV, "8")
    workspace = tmp_path / "ws"
    users = write_corpus(workspace)
    settings = Settings(workspace=workspace, db_path=tmp_path / "memory.duckdb")
    report = route_workspace(settings)
    files = _shard_files(settings, 8)
    for user in users:
        holders = [
            s for s, names in enumerate(files) if f"sessions/conv-{user}/2026-10-01.jsonl" in names
        ]
        assert holders == [shard_of(f"user:{user}", 8)], user
    # Shared notes are in every shard; the two-user conversation goes by the conversation.
    assert all("MEMORY.md" in names for names in files)
    shared_conversation = [
        s for s, names in enumerate(files) if "sessions/conv-shared/2026-10-05.jsonl" in names
    ]
    assert shared_conversation == [shard_of("conversation:conv-shared", 8)]
    assert read_routes(settings)["conv-shared"] == "conversation:conv-shared"
    assert [s for s, names in enumerate(files) if "sessions/loose.jsonl" in names] == [
        shard_of(f"user:{users[3]}", 8)
    ]
    # The entry goes with its conversation's user.
    entry = f"entries/conv-{users[0]}/facts/f1.md"
    assert [s for s, names in enumerate(files) if entry in names] == [
        shard_of(f"user:{users[0]}", 8)
    ]
    # Hard links: the same bytes, not a copy.
    shard = shard_settings(settings, shard_of(f"user:{users[0]}", 8), 8)
    linked = Path(shard.workspace) / f"sessions/conv-{users[0]}/2026-10-01.jsonl"
    assert (
        linked.stat().st_ino
        == (workspace / f"sessions/conv-{users[0]}/2026-10-01.jsonl").stat().st_ino
    )
    assert report.counts["linked"] > 0
    # Idempotent; a deleted file leaves its shard.
    assert route_workspace(settings).counts["linked"] == 0
    (workspace / f"sessions/conv-{users[0]}/2026-10-01.jsonl").unlink()
    again = route_workspace(settings)
    assert again.counts["unlinked"] == 1 and not linked.exists()


def test_a_look_routes_only_when_the_workspace_changed_and_asks_the_biggest_shard_first(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv(SHARDS_ENV, "4")
    workspace = tmp_path / "ws"
    users = write_corpus(workspace, users=8)
    # One user with much more to ingest than any other: that user's shard goes first.
    big = workspace / "sessions" / f"conv-{users[5]}" / "2026-10-01.jsonl"
    big.write_text(big.read_text() * 40)
    settle(workspace)
    settings = Settings(workspace=workspace, db_path=tmp_path / "memory.duckdb")

    first = look_at_shards(settings, {}, debounce_seconds=1.5)
    assert first.routed
    changed = first.changed_shards()
    assert sorted(changed) == [f"shard-{n:02d}" for n in range(4)]  # every shard has files
    sizes = [first.shards[key].changed_bytes for key in changed]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[1]
    assert changed[0] == f"shard-{shard_of(f'user:{users[5]}', 4):02d}"
    biggest = (tmp_path / "shards" / f"{changed[0]}.workspace").rglob("*")
    assert sizes[0] == sum(p.stat().st_size for p in biggest if p.is_file())

    # Nothing changed: no routing, no run, the shards' states kept.
    quiet = look_at_shards(settings, first.cursor, debounce_seconds=1.5)
    assert not quiet.routed and not quiet.changed_shards()
    assert {key: quiet.cursor[key] for key in changed} == {
        key: first.cursor[key] for key in changed
    }
    # A file touched with the same bytes asks for no run.
    os.utime(workspace / "MEMORY.md", (1e9, 1e9))
    assert not look_at_shards(settings, quiet.cursor, debounce_seconds=1.5).changed_shards()

    # A new file is routed and asks for its owner's shard only.
    new = workspace / "sessions" / f"conv-{users[2]}" / "2026-10-09.jsonl"
    new.write_text((workspace / "sessions" / f"conv-{users[2]}" / "2026-10-01.jsonl").read_text())
    settle(new.parent)
    later = look_at_shards(settings, quiet.cursor, debounce_seconds=1.5)
    assert later.routed
    assert later.changed_shards() == [f"shard-{shard_of(f'user:{users[2]}', 4):02d}"]
    assert later.shards[later.changed_shards()[0]].changes.new == [
        f"sessions/conv-{users[2]}/2026-10-09.jsonl"
    ]
    # A cursor of another shard count (a re-shard) routes again, whatever the workspace says.
    monkeypatch.setenv(SHARDS_ENV, "2")
    write_layout(settings, 2)
    assert look_at_shards(settings, later.cursor, debounce_seconds=1.5).routed


def _build(settings: Settings) -> None:
    run_all(settings, include_open=True)


def test_every_shard_equals_a_single_store_of_its_users_and_reshard_loses_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv(SHARDS_ENV, "3")
    settings = built_shards(tmp_path, 3, users=8)

    # A single store over a copy of the same files gives the same content, table by table.
    shard = all_shard_settings(settings)[1]
    copy = tmp_path / "single-ws"
    shutil.copytree(shard.workspace, copy)
    single = Settings(workspace=copy, db_path=tmp_path / "single" / "memory.duckdb")
    _build(single)
    assert store_tables(single.db_path)["memories"]
    assert not differences(shard.db_path, single.db_path)

    # 3 → 5 → 1 shards: every distinct row survives, and rows sit where the rule says.
    stores = [Path(s.db_path) for s in all_shard_settings(settings)]
    for path in stores:  # a row without a route key is in every shard: each copy is kept once
        with duckdb.connect(str(path)) as con:
            con.execute(
                "INSERT INTO relations (id, from_id, to_id, strength, created_at) VALUES "
                "('rel_shared', 'fact_shared_b', 'fact_shared_a', 0.8, '2026-01-01 00:00:00+00')"
            )
    before = row_digests(stores)
    monkeypatch.setenv(SHARDS_ENV, "5")
    reshard(settings, 5)
    five = [Path(s.db_path) for s in all_shard_settings(settings, 5)]
    assert row_digests(five) == before
    for number, path in enumerate(five):
        with duckdb.connect(str(path), read_only=True) as con:
            users = {
                row[0]
                for row in con.execute(
                    "SELECT DISTINCT user_id FROM memories WHERE user_id IS NOT NULL "
                    "AND conversation_id <> 'conv-shared'"
                ).fetchall()
            }
        assert all(shard_of(f"user:{user}", 5) == number for user in users), (number, users)
        assert (Path(all_shard_settings(settings, 5)[number].index_dir) / "CURRENT").exists()
    assert shard_count(settings) == 5
    monkeypatch.setenv(SHARDS_ENV, "1")
    reshard(settings, 1)
    assert row_digests([Path(settings.db_path)]) == before
    assert not (tmp_path / "data" / "shards").exists()
    assert (Path(settings.index_dir) / "CURRENT").exists()
