"""What each large table's keys and row groups cost a write, on a store the pipeline built.

    python benchmarks/store_writes.py STORE [--tables N] [--repeats R]

STORE is a `memory.duckdb` made by `memory-dag ingest` (for issue 15's figures: the 100k-turn
corpus of `benchmarks/whole_graph.py`). It is only read; the copies live in a temporary folder.

For the N largest tables that have a PRIMARY KEY or UNIQUE constraint:

1. **Insert.** All of the table's rows, from Arrow, into an empty copy of the table, once with
   its constraints and once without, in one transaction, through an instance that attaches
   the file as the store's writers do (`ROW_GROUP_SIZE` = `connection.ROW_GROUP_ROWS`):
   seconds and CPU seconds of INSERT + COMMIT + CHECKPOINT, and the file's size. The
   difference is what the constraint's ART index costs the pipeline to build and keep.
2. **One row touched, then a checkpoint.** On a copy of the whole store, one row of the
   table deleted and inserted again, then CHECKPOINT: through the writers' attach, and
   through a plain `duckdb.connect` (DuckDB's default row groups of 122,880 rows). This is
   what every writer's close pays after a small change (a sensor run, the live path).

Medians of `--repeats` runs. CPU seconds are this process's (DuckDB's threads included).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa

from memory_dag.store.connection import ROW_GROUP_ROWS, _attach


def timed(work: Callable[[], None]) -> tuple[float, float]:
    """Wall and CPU seconds of `work`."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def attached(path: Path, *, as_the_hub: bool) -> duckdb.DuckDBPyConnection:
    """`path` opened by the writers' hub's own attach (`connection._attach`: its row groups,
    its spill folder) as the default database, or by a plain `duckdb.connect(path)`."""
    if not as_the_hub:
        return duckdb.connect(str(path))
    con = _attach(path)
    con.execute("USE store")
    return con


def keyed_tables(store: Path, count: int) -> list[tuple[str, int, str, list[str]]]:
    """(name, rows, CREATE statement, constraints) of the largest tables with a key."""
    with duckdb.connect(str(store), read_only=True) as con:
        tables = con.execute(
            "SELECT table_name, estimated_size, sql FROM duckdb_tables() "
            "WHERE schema_name = 'main' ORDER BY estimated_size DESC"
        ).fetchall()
        constraints: dict[str, list[str]] = {}
        for table, text in con.execute(
            "SELECT table_name, constraint_text FROM duckdb_constraints() "
            "WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
        ).fetchall():
            constraints.setdefault(table, []).append(text)
    keyed = [(t, int(n), sql, constraints[t]) for t, n, sql in tables if t in constraints]
    return keyed[:count]


def without_constraints(create: str, constraints: list[str]) -> str:
    """The CREATE statement with its PRIMARY KEY / UNIQUE clauses taken out."""
    for constraint in constraints:
        create = create.replace(f", {constraint}", "")
    return create.replace(" PRIMARY KEY", "").replace(" UNIQUE", "")


def table_rows(store: Path, table: str) -> pa.Table:
    """Every row of `table`, read once for all the writes of it that are timed."""
    with duckdb.connect(str(store), read_only=True) as source:
        return source.execute(f"SELECT * FROM {table}").to_arrow_table()


def insert_cost(rows: pa.Table, table: str, create: str, folder: Path) -> tuple[float, float, int]:
    """Wall, CPU seconds and file bytes of writing `rows` into `table` of a new file."""
    path = folder / "insert.duckdb"
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
    con = attached(path, as_the_hub=True)
    con.execute(create)
    con.execute("CHECKPOINT")
    con.register("source_rows", rows)

    def write() -> None:
        con.execute("BEGIN TRANSACTION")
        con.execute(f"INSERT INTO {table} SELECT * FROM source_rows")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")

    wall, cpu = timed(write)
    con.close()
    return wall, cpu, path.stat().st_size


def touch_cost(store: Path, table: str, folder: Path, *, as_the_hub: bool) -> float:
    """Seconds of the CHECKPOINT after one row of `table` was deleted and inserted again."""
    path = folder / "touch.duckdb"
    shutil.copy(store, path)
    con = attached(path, as_the_hub=as_the_hub)
    con.execute("CHECKPOINT")
    con.execute("BEGIN TRANSACTION")
    con.execute(f"CREATE TEMP TABLE one_row AS SELECT * FROM {table} LIMIT 1")
    con.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} LIMIT 1)")
    con.execute(f"INSERT INTO {table} SELECT * FROM one_row")
    con.execute("COMMIT")
    wall, _ = timed(lambda: con.execute("CHECKPOINT"))
    con.close()
    path.unlink()
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--tables", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    store: Path = args.store
    print(f"store {store} ({store.stat().st_size / 1e6:.0f} MB), DuckDB {duckdb.__version__}")
    print(f"writers' row groups: {ROW_GROUP_ROWS:,} rows; repeats: {args.repeats} (medians)")
    print(
        f"{'table':<18}{'rows':>9}  {'insert: keyed':>22}  {'no key':>22}  "
        f"{'touch 1 row: writers':>21}  {'plain connect':>13}  key"
    )
    with tempfile.TemporaryDirectory(prefix="store-writes-") as scratch:
        folder = Path(scratch)
        for table, count, create, constraints in keyed_tables(store, args.tables):
            rows = table_rows(store, table)
            figures: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                for name, statement in (
                    ("keyed", create),
                    ("plain", without_constraints(create, constraints)),
                ):
                    wall, cpu, size = insert_cost(rows, table, statement, folder)
                    for part, value in (("wall", wall), ("cpu", cpu), ("mb", size / 1e6)):
                        figures.setdefault(f"{name}_{part}", []).append(value)
                for name, as_the_hub in (("touch_hub", True), ("touch_plain", False)):
                    cost = touch_cost(store, table, folder, as_the_hub=as_the_hub)
                    figures.setdefault(name, []).append(cost)
            m = {key: statistics.median(values) for key, values in figures.items()}
            print(
                f"{table:<18}{count:>9,}  "
                f"{m['keyed_wall']:5.2f} s {m['keyed_cpu']:5.2f} cpu {m['keyed_mb']:4.0f} MB  "
                f"{m['plain_wall']:5.2f} s {m['plain_cpu']:5.2f} cpu {m['plain_mb']:4.0f} MB  "
                f"{m['touch_hub']:19.2f} s  {m['touch_plain']:11.2f} s  {'; '.join(constraints)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
