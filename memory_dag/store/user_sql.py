"""A user's SQL (`memory-dag sql`): on a snapshot of the store, without access to files.

Two promises. First, a query cannot reach the filesystem: it runs with DuckDB's external
access disabled and the configuration locked (`read_text('/etc/shadow')`, `glob`, `COPY … TO`,
`EXPORT DATABASE`, `ATTACH`, `INSTALL`/`LOAD`, `SET` all fail), after the one extension the
project loads itself (FTS, from the duckdb-extension-fts package) is loaded.
`Settings.sql_external_access` (MEMORY_DAG_SQL_EXTERNAL_ACCESS=1) turns that off for trusted
local use. Second, a long query never keeps writers out: DuckDB lets a writer in only when no
other process has the file open, so the query reads a copy made while the store's lock was
held for the copy alone (DuckDB writes in place, so only a full copy is a snapshot; at 100k
chunks it takes 0.14-0.32 s: docs/benchmarks.md). The copy lives in a temporary folder and
is removed afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from memory_dag.config import Settings
from memory_dag.store.connection import load_fts, open_store


@dataclass
class SqlResult:
    """Column names and rows of a query (no columns for a statement without a result)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def run_user_sql(settings: Settings, query: str) -> SqlResult:
    """Run `query` on a snapshot of the store; raises FileNotFoundError when there is none."""
    with snapshot_copy(Path(settings.db_path)) as snapshot:
        con = duckdb.connect(str(snapshot), read_only=True)
        try:
            load_fts(con)
            if not settings.sql_external_access:
                lock_down(con)
            cursor = con.execute(query)
            if cursor.description is None:
                return SqlResult([], [])
            return SqlResult([d[0] for d in cursor.description], cursor.fetchall())
        finally:
            con.close()


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No file access from SQL, and no setting may change that for this connection."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


@contextmanager
def snapshot_copy(db_path: Path) -> Iterator[Path]:
    """A private copy of the store (and its write-ahead log), taken while no writer can write.

    The store's read lock is held only while copying; the copy is deleted on exit.
    """
    with tempfile.TemporaryDirectory(prefix="memory-dag-sql-") as folder:
        copy = Path(folder) / db_path.name
        with open_store(db_path, read_only=True):  # waits for a writer, then keeps writers out
            shutil.copyfile(db_path, copy)
            wal = db_path.with_name(db_path.name + ".wal")
            if wal.exists():
                shutil.copyfile(wal, copy.with_name(copy.name + ".wal"))
        yield copy
