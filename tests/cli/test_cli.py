"""The `memory-dag` command line: ingest (through Dagster and without it), search, sql, help
and the errors a user meets first, through `main([...])` and once as a real process."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pytest

from memory_dag.cli.main import build_parser, main
from memory_dag.config import ENV_PREFIX, Settings
from memory_dag.memory import Memory
from memory_dag.pipeline import run_all

REPO_ROOT = Path(__file__).resolve().parents[2]

#: What the `workspace` fixture becomes: 6 files (one with a broken line), 3 notes, 6 turns,
#: one chunk per note and per turn.
TABLES = {
    "files": 6,
    "episodes": 6,
    "notes": 3,
    "chunks": 9,
    "ingest_errors": 1,
}
ITEM_FIELDS = {"id", "memory", "kind", "score", "path", "start_line", "conversation_id", "run_id"}
CHECKS = {"chunks_are_valid", "every_chunk_embedded", "index_matches_embeddings"}
SISTER = "Where does Dana's sister live?"


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No MEMORY_DAG_* from the caller's shell; Dagster runs go to a temporary instance
    (with the project's dagster.yaml), never to the checkout's data/dagster_home."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "data" / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def paths(settings: Settings) -> list[str]:
    return [
        "--workspace",
        str(settings.workspace),
        "--db",
        str(settings.db_path),
        "--index-dir",
        str(settings.index_dir),
    ]


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    """`main(argv)` must succeed and print exactly one JSON document on stdout."""
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def ingested(settings: Settings) -> Settings:
    run_all(settings)
    return settings


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    subparsers = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)  # the parser's list of commands
    )
    commands = set(subparsers.choices)
    assert {"ingest", "search", "sql", "eval", "ui"} <= commands
    listed = re.search(r"^  \{([\w,-]+)\}$", out, re.MULTILINE)
    assert listed, out
    assert set(listed.group(1).split(",")) == commands
    # Each command on its own line with its one-line help (old names in brackets after it).
    described = dict(re.findall(r"^    (\w[\w-]*)(?: \([\w, ]+\))?\s+(\S.*)$", out, re.MULTILINE))
    assert described["ingest"] == "materialize every asset"
    assert described["search"] == "hybrid search"
    assert described["sql"] == "run SQL on the store (read-only)"
    assert described["eval"] == "retrieval quality on a benchmark"
    primary = {action.dest for action in subparsers._choices_actions}
    assert set(described) == primary
    assert {"remember", "correct", "forget"} <= commands - primary  # old names still work


@pytest.mark.parametrize("argv", [["search", "anything"], ["sql", "SELECT 1"]])
def test_querying_before_ingest_exits_2_with_a_hint(
    argv: list[str], settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, *paths(settings), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("memory-dag: ")
    assert "run `memory-dag ingest` first" in captured.err
    assert not settings.db_path.exists()  # a failed query creates no empty store


def test_ingest_json_through_dagster(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = run_json(capsys, ["ingest", "--json", *paths(settings)])
    assert set(summary) == {"workspace", "db", "index", "seconds", "stages", "tables"}
    assert summary["db"] == str(settings.db_path)
    assert summary["index"] == str(settings.index_dir)
    assert summary["workspace"] == str(settings.workspace)
    tables = summary["tables"]
    assert {k: tables[k] for k in TABLES} == TABLES
    assert tables["embedding_cache"] >= 1
    stages = summary["stages"]
    # One entry per materialized asset (the ingest graph may grow), plus the check results.
    assert set(stages) >= {
        "workspace_files",
        "chunks",
        "chunk_embeddings",
        "search_index",
        "chunks_fts",
        "checks",
    }
    assert set(stages["checks"]) >= CHECKS
    assert set(stages["checks"].values()) == {"passed"}
    assert stages["workspace_files"]["new"] == 6
    assert stages["workspace_files"]["errors"] == 1
    assert stages["chunks"]["chunks"] == 9
    # Chunks, plus the derived memories the run wrote (facts, conversation summaries).
    assert stages["search_index"]["rows"] == 9 + tables["facts"] + tables["summaries"]

    # The run is in the instance `memory-dag ui` would show (here: the test's DAGSTER_HOME):
    # one run of the whole graph, the summaries of the new conversations in one step.
    with dg.DagsterInstance.get() as instance:
        [run] = instance.get_runs()
        partitions = instance.get_dynamic_partitions("conversations")
        assert sorted(partitions) == ["conv-a", "conv-b", "trip"]
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/asset_partition_range_start"] == partitions[0]
        assert run.tags["dagster/asset_partition_range_end"] == partitions[-1]
    assert stages["conversation_summaries"]["conversations"] == 3

    # --force reaches every forceable asset's config: all files re-read, same tables after.
    again = run_json(capsys, ["ingest", "--json", "--force", *paths(settings)])
    assert again["tables"] == tables
    files = again["stages"]["workspace_files"]
    assert (files["new"], files["changed"], files["unchanged"]) == (0, 6, 0)
    assert again["stages"]["search_index"]["skipped"] is False  # rebuilt, not "unchanged"
    assert again["stages"]["chunks_fts"]["skipped"] is False


def test_ingest_without_dagster(
    settings: Settings, isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = run_json(capsys, ["ingest", "--no-dagster", "--json", *paths(settings)])
    assert {k: summary["tables"][k] for k in TABLES} == TABLES
    stages = summary["stages"]
    assert "checks" not in stages
    for report in stages.values():
        assert set(report) == {"counts", "seconds", "notes", "skipped", "errors"}
    order = ["files", "chunks", "embeddings", "search_index", "chunks_fts"]
    assert [name for name in stages if name in order] == order  # every stage, in order
    files = stages["files"]
    assert files["counts"]["new"] == 6
    assert [(e["path"], e["line"]) for e in files["errors"]] == [("sessions/conv-a/s2.jsonl", 2)]
    # No Dagster involved: nothing was written to the instance.
    assert sorted(p.name for p in isolated_env.iterdir()) == ["dagster.yaml"]

    # The human-readable form: stage lines on stderr, a summary on stdout.
    assert main(["ingest", "--no-dagster", *paths(settings)]) == 0
    captured = capsys.readouterr()
    assert "running the pipeline stages in-process (no Dagster)" in captured.err
    assert "files 6, episodes 6, notes 3, chunks 9" in captured.out
    assert "ingest errors 1" in captured.out


def test_search_json(ingested: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", SISTER, "--json", "--conversation", "conv-a", "--limit", "2"]
    found = run_json(capsys, [*argv, *paths(ingested)])
    assert found["query"] == SISTER
    hits = found["results"]
    assert 1 <= len(hits) <= 2
    for hit in hits:
        assert set(hit) >= ITEM_FIELDS
        assert hit["conversation_id"] == "conv-a"
    top = hits[0]
    assert top["id"].startswith("ep_")  # a turn's episode id: what `history` and `get` take
    assert top["path"] == "sessions/conv-a/s1.jsonl"
    assert top["start_line"] == 3
    assert "Toronto" in top["memory"]
    assert top["run_id"] == "s1"
    everything = run_json(capsys, [*argv, "--min-score", "0", *paths(ingested)])["results"]
    assert len(everything) == 2  # --limit caps the 5 turns of conv-a
    assert everything[0]["id"] == top["id"]
    scores = [hit["score"] for hit in everything]
    assert scores == sorted(scores, reverse=True)
    # The command is `Memory.search`, serialised.
    expected = Memory(ingested).search(SISTER, conversation_id="conv-a", limit=2)
    assert found == expected.to_dict()


def test_search_old_flag_names_still_work(
    ingested: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["search", SISTER, "--json", "--conversation", "conv-a", *paths(ingested)]
    assert run_json(capsys, [*argv, "--k", "1"]) == run_json(capsys, [*argv, "--limit", "1"])
    assert len(run_json(capsys, [*argv, "--k", "1"])["results"]) == 1
    assert run_json(capsys, [*argv, "--session", "s1"]) == run_json(capsys, [*argv, "--run", "s1"])


def test_sql_json(ingested: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_json(capsys, ["sql", "SELECT count(*) AS n FROM chunks", "--json", *paths(ingested)])
    assert rows == [{"n": 9}]
    # The FTS extension is loaded, so the DuckDB full-text index is usable from the CLI.
    query = (
        "SELECT path FROM (SELECT path, fts_main_chunks.match_bm25(id, 'Toronto') AS s "
        "FROM chunks) WHERE s IS NOT NULL"
    )
    rows = run_json(capsys, ["sql", query, "--json", *paths(ingested)])
    assert rows == [{"path": "sessions/conv-a/s1.jsonl"}]
    # Read-only: a write does not succeed (today it raises DuckDB's error) and changes nothing.
    try:
        code: int | None = main(["sql", "DELETE FROM chunks", *paths(ingested)])
    except duckdb.Error:
        code = None
    assert code != 0
    rows = run_json(capsys, ["sql", "SELECT count(*) AS n FROM chunks", "--json", *paths(ingested)])
    assert rows == [{"n": 9}]


def console_script() -> list[str]:
    script = Path(sys.executable).with_name("memory-dag")
    return [str(script)] if script.exists() else [sys.executable, "-m", "memory_dag.cli.main"]


def test_real_process(
    ingested: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    argv = ["search", SISTER, "--json", "--conversation", "conv-a", "--k", "2"]
    done = subprocess.run(
        [*console_script(), *argv, *paths(ingested)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)  # stdout is nothing but the JSON document
    top = hits["results"][0]
    assert (top["path"], top["start_line"]) == ("sessions/conv-a/s1.jsonl", 3)
    assert hits == run_json(capsys, [*argv, *paths(ingested)])  # same as in-process

    missing = ["--index-dir", str(tmp_path / "no-index")]
    done = subprocess.run(
        [*console_script(), "search", "anything", "--json", *missing],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert "run `memory-dag ingest` first" in done.stderr


def test_the_command_leaves_fast_but_flushes_and_runs_exit_handlers(tmp_path: Path) -> None:
    """`run` skips the interpreter's teardown (`os._exit`): the output must still arrive
    whole, the exit handlers must still run and the code must be `main`'s."""
    marker = tmp_path / "handler-ran"
    program = f"""
import atexit, pathlib
from memory_dag.cli import main as cli
atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("ran"))
def main():
    print("x" * 1_000_000)
    return 3
cli.main = main
cli.run()
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    assert len(done.stdout) == 1_000_001
    assert marker.read_text() == "ran"
