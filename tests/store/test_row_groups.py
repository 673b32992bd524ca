"""Writers reach the store through one in-process hub that attaches it with small row groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from memory_dag.store.connection import (
    ROW_GROUP_ROWS,
    _hubs,
    close_store,
    connect,
    open_store,
)


def row_groups(path: Path, table: str) -> int:
    with open_store(path, read_only=True) as con:
        return con.execute(
            "SELECT count(DISTINCT row_group_id) FROM pragma_storage_info(?)", [table]
        ).fetchone()[0]


def test_tables_are_written_in_small_row_groups(tmp_path: Path) -> None:
    """A checkpoint rewrites each row group a write touched: an append to a table in one big
    group rewrote all of it."""
    db = tmp_path / "m.duckdb"
    rows = 3 * ROW_GROUP_ROWS + 10
    with open_store(db) as con:
        con.execute(
            "INSERT INTO store_meta (key, value, updated_at) "
            "SELECT 'k' || range, 'v', now() FROM range(?)",
            [rows],
        )
    assert row_groups(db, "store_meta") >= 3  # DuckDB's default size would make one


def test_writers_in_one_process_share_the_store_and_the_last_close_checkpoints(
    tmp_path: Path,
) -> None:
    db = tmp_path / "m.duckdb"
    first = connect(db)
    second = connect(db)  # a second writer (another thread's) joins the same hub
    second.execute("INSERT INTO store_meta VALUES ('a', 'b', now())")
    assert first.execute("SELECT value FROM store_meta WHERE key = 'a'").fetchone() == ("b",)
    close_store(second)
    assert len(_hubs) == 1  # `first` still holds the store
    close_store(first)
    assert _hubs == {}
    assert not Path(f"{db}.wal").exists()  # checkpointed when the last writer closed
    # Another process can open it now (the lock went with the hub).
    script = "import duckdb, sys; print(duckdb.connect(sys.argv[1]).execute(" + (
        "\"SELECT value FROM store_meta WHERE key = 'a'\").fetchone()[0])"
    )
    done = subprocess.run([sys.executable, "-c", script, str(db)], capture_output=True, text=True)
    assert done.stdout.strip() == "b", done.stderr


def test_a_path_with_quotes_is_attached_as_given(tmp_path: Path) -> None:
    """The store's path reaches ATTACH as a quoted SQL string, whatever it holds."""
    folder = tmp_path / 'it\'s a "folder"; DROP TABLE x; --'
    db = folder / "m.duckdb"
    with open_store(db) as con:
        con.execute("INSERT INTO store_meta VALUES ('k', 'v', now())")
    assert db.exists()
    assert duckdb.connect(str(db), read_only=True).execute(
        "SELECT value FROM store_meta WHERE key = 'k'"
    ).fetchone() == ("v",)


def test_a_writer_spills_beside_the_store_not_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub is an in-memory instance, whose own default spill folder is `./.tmp`: a large
    query would leave files wherever the command was started (or fail where that is read-only)."""
    db = tmp_path / "store" / "m.duckdb"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with open_store(db) as con:
        con.execute("SET memory_limit = '100MB'")
        con.execute("SET threads = 1")
        con.execute(
            "CREATE TABLE big AS SELECT range AS n, md5(range::VARCHAR) AS h FROM range(2000000)"
        )
        spilled = con.execute("SELECT n FROM big ORDER BY h LIMIT 1 OFFSET 1999999").fetchall()
        assert len(spilled) == 1
        assert con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == f"{db}.tmp"
        assert Path(f"{db}.tmp").is_dir()  # the table and the sort did not fit in 100 MB
    assert not (elsewhere / ".tmp").exists()
