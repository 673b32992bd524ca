"""The command line on a sharded store: ingest every shard, route by --user, re-shard."""

from __future__ import annotations

import json
from pathlib import Path

from memory_dag.cli.main import main
from memory_dag.store.shards import SHARDS_ENV, shard_of
from tests.scale.corpus import write_corpus


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
        return json.loads(capsys.readouterr().out)

    # user001 talks about pizza, user002 about chess; each is answered from its own shard.
    hits = search("user001", "pizza anchovies")
    assert hits and all("conv-user001" in hit["path"] for hit in hits)
    assert shard_of("user:user001", 4) != shard_of("user:user004", 4)
    other = search("user004", "pizza anchovies")  # a shard without user001's rows
    assert other and all("conv-user004" in hit["path"] for hit in other)
    assert not any("anchovies" in hit["snippet"] for hit in other)
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
