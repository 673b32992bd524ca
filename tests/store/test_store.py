"""The store file: forward migrations on open, bounded waiting on DuckDB's single-writer lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from memory_dag.store.connection import (
    StoreLockedError,
    _hubs,
    connect,
    open_store,
    schema_version,
    set_meta,
)
from memory_dag.store.schema import RELATIONS_EDGE_KEY, SCHEMA_VERSION

HOLD_LOCK = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
con.execute("CREATE TABLE IF NOT EXISTS held (x INTEGER)")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
"""


def hold_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "locked"
    return process


def test_new_store_is_migrated_to_the_latest_schema(tmp_path: Path) -> None:
    with open_store(tmp_path / "m.duckdb") as con:
        assert schema_version(con) == SCHEMA_VERSION
        tables = {
            r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
        }
    assert {"files", "chunks", "memories", "embedding_cache", "ingest_errors", "episodes"} <= tables


def test_the_named_relations_key_is_the_tables_own_unique_key(tmp_path: Path) -> None:
    # Inserts into `relations` name it as their conflict target: it must stay the table's key.
    with open_store(tmp_path / "m.duckdb") as con:
        keys = con.execute(
            "SELECT constraint_column_names FROM duckdb_constraints() "
            "WHERE table_name = 'relations' AND constraint_type = 'UNIQUE'"
        ).fetchall()
    named = [column.strip() for column in RELATIONS_EDGE_KEY.strip("()").split(",")]
    assert keys == [(named,)]


def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    with open_store(path) as con:
        con.execute("INSERT INTO ingest_errors VALUES ('a.md', 1, 'bad', NULL, now())")
    with open_store(path) as con:
        assert con.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 1


def test_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    """Refused after the writers' hub attached it: the hub, and the file's lock, go too."""
    path = tmp_path / "m.duckdb"
    with open_store(path) as con:
        set_meta(con, "schema_version", str(SCHEMA_VERSION + 1))
    with pytest.raises(RuntimeError, match="newer"):
        connect(path)
    assert _hubs == {}


def test_read_only_open_of_a_missing_store_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="memory-dag ingest"):
        connect(tmp_path / "nothing.duckdb", read_only=True)


def test_open_waits_for_another_writer_to_finish(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    with open_store(path):
        pass
    holder = hold_lock(path, 1.5)
    started = time.monotonic()
    with open_store(path, lock_timeout=30) as con:
        waited = time.monotonic() - started
        assert con.execute("SELECT count(*) FROM files").fetchone()[0] == 0
    holder.communicate()  # it ends by itself; this reaps it and closes its pipe
    assert waited > 0.5  # it really was blocked, and got in once the lock was free


def test_open_gives_up_with_a_clear_error_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    holder = hold_lock(path, 5)
    try:
        with pytest.raises(StoreLockedError, match="locked by another process"):
            connect(path, lock_timeout=0.5)
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipes


def test_non_lock_errors_are_not_retried(tmp_path: Path) -> None:
    not_a_db = tmp_path / "junk.duckdb"
    not_a_db.write_bytes(b"this is not a duckdb file at all" * 200)
    started = time.monotonic()
    with pytest.raises(duckdb.Error):
        connect(not_a_db, lock_timeout=30)
    assert time.monotonic() - started < 5


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs 2 cores"
)
def test_a_process_pinned_to_one_core_runs_duckdb_on_one_thread(tmp_path: Path) -> None:
    """A shard's worker held to one core (taskset, a cpuset) must not run DuckDB's default
    pool of one thread per machine core on it; an unpinned process keeps DuckDB's default."""
    script = (
        "import os, sys\n"
        "from memory_dag.store.connection import connect\n"
        "if sys.argv[2] == 'pinned':\n"
        "    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "con = connect(sys.argv[1])\n"
        "print(con.execute(\"SELECT current_setting('threads')\").fetchone()[0])\n"
    )
    threads = {}
    for mode in ("pinned", "free"):
        db = tmp_path / f"{mode}.duckdb"
        done = subprocess.run(
            [sys.executable, "-c", script, str(db), mode], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        threads[mode] = int(done.stdout.strip())
    assert threads["pinned"] == 1
    assert (
        threads["free"]
        == duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]
    )
