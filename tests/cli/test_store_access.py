"""The CLI and the store's files: SQL cannot reach the filesystem, a long read never holds up a
writer, a lock or a missing store is one clear line, and --db picks the store and its index."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.index.published import current_version
from memory_dag.pipeline import run_all
from memory_dag.store.connection import open_store
from tests.cli.test_cli import isolated_env  # noqa: F401 (autouse: no MEMORY_DAG_*)
from tests.conftest import write_jsonl
from tests.hostile_inputs import sql_escapes
from tests.kill_points import cli, cli_env


@pytest.fixture
def ingested(settings: Settings) -> Settings:
    run_all(settings)
    return settings


def db_args(settings: Settings) -> list[str]:
    return ["--db", str(settings.db_path), "--workspace", str(settings.workspace)]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a failed command (a progress line may come before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ERROR" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("memory-dag: ")]
    assert len(errors) == 1 and err.strip().endswith(errors[0]), err
    return errors[0]


# --- memory-dag sql ----------------------------------------------------------------------------


def test_sql_cannot_reach_the_filesystem_or_change_the_store(
    ingested: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version = current_version(ingested.index_dir)
    store_bytes = ingested.db_path.read_bytes()
    before = sorted(p.name for p in tmp_path.iterdir())
    tried = sql_escapes(ingested, tmp_path)
    after_secret = sorted({*before, "secret.txt"})

    for query in tried:
        capsys.readouterr()
        code = main(["sql", query, *db_args(ingested)])
        out = capsys.readouterr()
        assert code != 0, query
        assert "the secret" not in out.out and "the secret" not in out.err

    assert current_version(ingested.index_dir) == version
    assert ingested.db_path.read_bytes() == store_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == after_secret
    assert main(["sql", "SELECT count(*) FROM chunks", *db_args(ingested)]) == 0


def test_trusted_use_may_turn_file_access_back_on(
    ingested: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = tmp_path / "notes.txt"
    secret.write_text("a local file\n")
    query = f"SELECT content FROM read_text('{secret}')"
    monkeypatch.setenv("MEMORY_DAG_SQL_EXTERNAL_ACCESS", "1")
    capsys.readouterr()

    assert main(["sql", query, "--json", *db_args(ingested)]) == 0
    assert "a local file" in capsys.readouterr().out


def _hold_lock(db_path: Path) -> subprocess.Popen:
    """Another process holding the store's write lock until killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); "
            "print('locked', flush=True); time.sleep(600)",
            str(db_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_a_long_sql_read_does_not_keep_writers_out(ingested: Settings, tmp_path: Path) -> None:
    snapshots = tmp_path / "tmp"
    snapshots.mkdir()
    env = {**cli_env(), "TMPDIR": str(snapshots)}
    long_query = "SELECT sum(i % 7) FROM range(100000000000) t(i)"  # minutes of work
    reader = subprocess.Popen(
        [*cli(), "sql", long_query, *db_args(ingested)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Once its snapshot folder holds the copy's write-ahead-free file, the lock is released.
        deadline = time.monotonic() + 120
        while not any(snapshots.glob("memory-dag-sql-*/memory.duckdb")):
            assert reader.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # the query is now running on the copy

        with open_store(ingested.db_path, lock_timeout=30) as con:  # a writer gets in
            con.execute("CREATE TABLE written_while_reading AS SELECT 1 AS x")

        assert reader.poll() is None  # while the long read still runs
    finally:
        reader.kill()
        reader.communicate()  # reaps it and closes its pipes
    assert list(snapshots.iterdir()) == [] or all(  # the copy is removed (or dies with it)
        p.name.startswith("memory-dag-sql-") for p in snapshots.iterdir()
    )


# --- locks and missing stores ------------------------------------------------------------------


LOCKED_COMMANDS = [
    ["sql", "SELECT 1"],
    ["stats"],
    ["changes"],
    ["entity", "Dana"],
    ["ingest", "--no-dagster"],
    ["ingest"],
]


@pytest.mark.parametrize("argv", LOCKED_COMMANDS, ids=lambda argv: " ".join(argv))
def test_a_held_lock_is_one_line_and_exit_2(
    argv: list[str],
    ingested: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMORY_DAG_LOCK_TIMEOUT", "0.5")
    holder = _hold_lock(ingested.db_path)
    try:
        capsys.readouterr()
        code = main([*argv, *db_args(ingested)])
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipes

    assert code == 2
    line = one_line_error(capsys)
    assert "is locked by another process" in line and "try again when it has finished" in line


def test_a_write_goes_through_while_a_pipeline_holds_the_store(
    ingested: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live write never waits for the DuckDB lock: durable and searchable at once."""
    monkeypatch.setenv("MEMORY_DAG_LOCK_TIMEOUT", "0.5")
    holder = _hold_lock(ingested.db_path)
    try:
        capsys.readouterr()
        assert main(["add", "Sam likes green tea.", "-q", *db_args(ingested)]) == 0
        memory_id = capsys.readouterr().out.strip()
        assert memory_id.startswith("fact_")
        assert main(["search", "green tea", "--json", *db_args(ingested)]) == 0
        found = json.loads(capsys.readouterr().out)["results"]
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipes
    assert memory_id in [hit["id"] for hit in found]


READERS = [
    ["search", "anything"],
    ["context", "anything", "--conversation", "demo"],
    ["query", "anything", "--agent", "supervisor"],
    ["sql", "SELECT 1"],
    ["stats"],
    ["changes"],
    ["history", "fact_1"],
    ["entity", "Dana"],
    ["summary", "demo"],
    ["summarize"],
    ["export", "out"],
    ["remember", "Sam likes green tea."],
    ["forget", "fact_1"],
]


@pytest.mark.parametrize("argv", READERS, ids=lambda argv: argv[0])
def test_a_missing_store_is_an_error_and_leaves_no_files(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "stores"
    folder.mkdir()

    code = main([*argv, "--db", str(folder / "missing.duckdb")])

    assert code == 2
    assert "no memory store at" in one_line_error(capsys)
    assert list(folder.iterdir()) == []  # no missing.duckdb, no missing.access/
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dagster_home", "stores"]


def test_each_store_has_its_own_index_and_search_and_context_use_the_one_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stores = tmp_path / "stores"
    for name, text in (("cats", "I adopted a cat named Miso."), ("tea", "I prefer green tea.")):
        workspace = tmp_path / name
        write_jsonl(
            workspace / "sessions" / "demo" / "s1.jsonl", [{"role": "user", "content": text}]
        )
        run_all(Settings(workspace=workspace, db_path=stores / f"{name}.duckdb"))
    assert sorted(p.name for p in stores.iterdir() if p.is_dir()) == ["cats.index", "tea.index"]

    capsys.readouterr()
    assert main(["search", "cat Miso", "--min-score", "0", "--db", str(stores / "tea.duckdb")]) == 0
    answer = capsys.readouterr().out
    assert "green tea" in answer and "Miso" not in answer

    argv = ["context", "what pet?", "--conversation", "demo", "--min-score", "0"]
    assert main([*argv, "--db", str(stores / "cats.duckdb")]) == 0
    answer = capsys.readouterr().out
    assert "Miso" in answer and "green tea" not in answer
