"""Opening the DuckDB memory store: short connections, lock-aware retries, forward migrations.

DuckDB allows one writing process per file. Every writer here keeps its connection short
(open, write, close), and every opener waits a bounded time when another process holds the
lock instead of failing at once (60 s, or MEMORY_DAG_LOCK_TIMEOUT). Search does not open the
file at all: it reads the last published index (see `index/published.py`), so it never waits
on a running pipeline; `memory-dag sql` reads a copy (`user_sql.py`), so it never holds one up.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:  # PyArrow (and NumPy under it) only where rows move: not in every CLI start
    import pyarrow as pa

from memory_dag.store.schema import MIGRATIONS, SCHEMA_VERSION

#: DuckDB's memory for one process's store connections; beyond it, large queries and the FTS
#: build spill to disk (`<store>.tmp/`). `MEMORY_DAG_DUCKDB_MEMORY_LIMIT` overrides it.
DUCKDB_MEMORY_LIMIT = os.environ.get("MEMORY_DAG_DUCKDB_MEMORY_LIMIT", "2GB")


class StoreLockedError(RuntimeError):
    """Another process kept the store's write lock for longer than we were willing to wait."""


def is_lock_error(error: BaseException) -> bool:
    """True for DuckDB's 'Could not set lock on file' conflicts (and only those), and for its
    refusal to open a file this process already holds in another mode (a pipeline run in a
    thread of this process, beside a live reader): the same conflict, within one process."""
    message = str(error).lower()
    if isinstance(error, duckdb.ConnectionException):
        return "different configuration" in message
    if isinstance(error, duckdb.BinderException):  # a writer while this process reads it
        return "unique file handle conflict" in message
    return isinstance(error, duckdb.IOException) and (
        "could not set lock" in message or "conflicting lock" in message
    )


#: Seconds an opener waits for another process's lock by default (MEMORY_DAG_LOCK_TIMEOUT).
DEFAULT_LOCK_TIMEOUT = 60.0


def default_lock_timeout() -> float:
    """`MEMORY_DAG_LOCK_TIMEOUT` if set (seconds), else `DEFAULT_LOCK_TIMEOUT`."""
    raw = os.environ.get("MEMORY_DAG_LOCK_TIMEOUT", "").strip()
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_LOCK_TIMEOUT
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT


def process_cores() -> int:
    """Cores this process may run on: its CPU set (`taskset`, a container's cpuset) where the
    OS has one, else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pinned_cores() -> int | None:
    """The cores this process may run on, when it is held to fewer than the machine has.

    DuckDB sizes its thread pool by the machine, not by the process's CPU set: a worker pinned to
    one core (`taskset`, a container's cpuset, one Celery worker per core in a sharded
    deployment) would run two threads on it. FAISS and OpenBLAS already follow the CPU set.
    """
    cores = process_cores()
    return cores if cores < (os.cpu_count() or cores) else None


#: Rows per row group in the tables this process writes (DuckDB's default: 122,880). A
#: checkpoint, which every writer's close makes, rewrites each row group a write touched: with
#: the default, 20 new chunks or 23 new vectors rewrote the whole 100k-row `chunks` or
#: `embedding_cache` group (1-2 s each at 100k turns, most of a one-session run); with this
#: size, the last small group (~0.05 s). Scans are as fast. DuckDB takes the size per ATTACH,
#: not per file, so writers reach the store through an in-process hub that attaches it so.
ROW_GROUP_ROWS = 16_384


@dataclass
class _Hub:
    """One DuckDB instance with the store attached (as `store`, the connections' default
    catalog), shared by this process's writable connections as DuckDB shares the instance of
    `duckdb.connect(path)`: it is closed, and the store checkpointed, when the last one is."""

    instance: duckdb.DuckDBPyConnection
    users: int = 0


_hubs: dict[Path, _Hub] = {}
_hubs_lock = threading.Lock()
#: The hub of each writable connection handed out (by `id`), for `close_store`.
_hub_of: dict[int, Path] = {}


def _attach(path: Path) -> duckdb.DuckDBPyConnection:
    """A new instance with the store at `path` attached as its default database.

    It spills where a plain `duckdb.connect(path)` would (`<store>.tmp/`): an in-memory
    instance's default is `.tmp` in the current directory, wherever the command was started."""
    instance = duckdb.connect(config={"temp_directory": f"{path}.tmp"})
    try:
        literal = "'" + str(path).replace("'", "''") + "'"  # a path, quoted as a SQL string
        instance.execute(f"ATTACH {literal} AS store (ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
    except BaseException:
        instance.close()
        raise
    return instance


def _writable(path: Path) -> duckdb.DuckDBPyConnection:
    """A connection through this process's hub for `path` (attached on first use)."""
    key = path.resolve()
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None:
            hub = _hubs[key] = _Hub(_attach(key))
        con = hub.instance.cursor()
        try:
            con.execute("USE store")
        except BaseException:
            con.close()
            raise
        hub.users += 1
        _hub_of[id(con)] = key
    return con


def close_store(con: duckdb.DuckDBPyConnection) -> None:
    """Close a connection from `connect`; the last writable one of a store closes its hub
    (which checkpoints the store and lets other processes open it)."""
    con.close()
    with _hubs_lock:
        key = _hub_of.pop(id(con), None)
        hub = _hubs.get(key) if key is not None else None
        if hub is None:
            return
        hub.users -= 1
        if hub.users == 0:
            del _hubs[key]
            hub.instance.close()


def connect(
    db_path: str | Path, *, read_only: bool = False, lock_timeout: float | None = None
) -> duckdb.DuckDBPyConnection:
    """Open the store, waiting up to `lock_timeout` seconds (default: `default_lock_timeout()`)
    for another writer to finish. Close it with `close_store`.

    A writable connection migrates the schema forward before it is returned.
    """
    if lock_timeout is None:
        lock_timeout = default_lock_timeout()
    path = Path(db_path)
    if read_only and not path.exists():
        raise FileNotFoundError(f"no memory store at {path}: run `memory-dag ingest` first")
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + lock_timeout
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(path), read_only=True) if read_only else _writable(path)
            break
        except (duckdb.IOException, duckdb.ConnectionException, duckdb.BinderException) as error:
            if not is_lock_error(error) or time.monotonic() >= deadline:
                if is_lock_error(error):
                    raise StoreLockedError(
                        f"{path} is locked by another process (a running pipeline?) and "
                        f"stayed locked for {lock_timeout:g}s"
                    ) from error
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    try:
        # DuckDB would take up to 80% of the machine's memory before spilling to disk.
        con.execute(f"SET memory_limit = '{DUCKDB_MEMORY_LIMIT}'")
        cores = pinned_cores()
        if cores is not None:
            con.execute(f"SET threads = {cores}")
        if not read_only:
            migrate(con)
    except BaseException:  # a refused store (a newer schema) must not keep the hub and its lock
        close_store(con)
        raise
    return con


@contextmanager
def open_store(
    db_path: str | Path, *, read_only: bool = False, lock_timeout: float | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """`with open_store(path) as con:` — a short-lived connection that is always closed."""
    con = connect(db_path, read_only=read_only, lock_timeout=lock_timeout)
    try:
        yield con
    finally:
        close_store(con)


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'store_meta'"
    ).fetchone()
    if not exists or exists[0] == 0:
        return 0
    row = con.execute("SELECT value FROM store_meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply the migrations this store has not seen yet, each in its own transaction."""
    current = schema_version(con)
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"store schema version {current} is newer than this memory-dag ({SCHEMA_VERSION})"
        )
    for version in range(current, SCHEMA_VERSION):
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(MIGRATIONS[version])
            set_meta(con, "schema_version", str(version + 1))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION - current


def get_meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    row = con.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchone()
    return row[0] if row else None


def set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute(
        "INSERT OR REPLACE INTO store_meta (key, value, updated_at) VALUES (?, ?, now())",
        [key, value],
    )


def insert_arrow(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table) -> int:
    """Bulk insert through Arrow (DuckDB's executemany is ~1,000x slower)."""
    if rows.num_rows == 0:
        return 0
    with registered(con, "_incoming", rows):
        columns = ", ".join(rows.column_names)
        con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _incoming")
    return rows.num_rows


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, rows: pa.Table) -> Iterator[None]:
    """`rows` readable as the view `name` inside the block (an `UPDATE ... FROM name` of many
    rows in one statement)."""
    con.register(name, rows)
    try:
        yield
    finally:
        con.unregister(name)


@contextmanager
def listed(con: duckdb.DuckDBPyConnection, name: str, values: Sequence[str]) -> Iterator[None]:
    """`values` readable as the one-column view `name` (column `value`) inside the block: for
    `WHERE id IN (SELECT value FROM name)` over many values.

    Why not a bound list (`unnest(?::TEXT[])`): DuckDB's Python client converts a bound value
    element by element and tries to import pandas before each one (two failed imports, ~0.1 ms
    an element when pandas is not installed), so 10k ids cost a second; a view costs nothing.
    """
    import pyarrow as pa

    with registered(con, name, pa.table({"value": pa.array(values, pa.string())})):
        yield


def fetch_arrow(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
) -> pa.Table:
    """The whole result as one Arrow table (`.arrow()` may hand back a batch reader)."""
    result = con.execute(sql, params or []).arrow()
    return result.read_all() if hasattr(result, "read_all") else result


def fetch_dicts(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None):
    """Rows as dicts, for previews and small lookups."""
    cursor = con.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def load_fts(con: duckdb.DuckDBPyConnection) -> str:
    """Load DuckDB's full-text extension, offline when `duckdb-extension-fts` is installed.

    Returns how it was loaded ("package" or "install"), for run metadata.
    """
    try:
        import duckdb_extension_fts
    except ImportError:
        con.execute("INSTALL fts")
        con.execute("LOAD fts")
        return "install"
    folder = Path(duckdb_extension_fts.__file__).parent / "extensions" / f"v{duckdb.__version__}"
    extension = folder / "fts.duckdb_extension"
    if not extension.exists():
        raise RuntimeError(
            f"duckdb-extension-fts has no build for duckdb {duckdb.__version__} ({extension}); "
            "pin both packages to the same version"
        )
    con.execute(f"LOAD '{extension.as_posix()}'")
    return "package"


def to_json(value: Any) -> str:
    """JSON for DuckDB JSON columns; dates and other objects become strings."""
    return json.dumps(value, default=str, ensure_ascii=False)
