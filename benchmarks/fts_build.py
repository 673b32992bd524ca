"""DuckDB's FTS index over `chunks`: the extension's build against `index/chunks_fts.py`'s fill.

    python benchmarks/fts_build.py --store data/memory.duckdb --copies 1,10 --repeats 2

`--store` is a store `memory-dag ingest` built (its `chunks` are read, never written). For each
size, the chunks are copied (`--copies` times, each copy under new ids) into a new store in
`--tmp`, as a new store's chunks stage writes them, with the index made empty while the table
was. Each build then runs in a fresh process on a copy of that store, the two ways
alternating: `PRAGMA create_fts_index` (the extension's own build, as a forced run does) and
`refresh_chunks_fts` (what the index step runs). Prints wall and CPU seconds and peak RSS of
each, their medians, and whether the two indexes hold the same documents, terms and df.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: What one build prints back (run in a fresh process: `--build`).
_WAYS = ("pragma", "fill")


def make_store(source: Path, target: Path, copies: int) -> int:
    """`copies` copies of `source`'s chunks in a new store at `target`; the chunk count."""
    from memory_dag.index.chunks_fts import make_empty_index
    from memory_dag.store.connection import open_store

    with open_store(target) as con:
        assert make_empty_index(con), "the new store's chunks should be empty"
        literal = "'" + str(source).replace("'", "''") + "'"
        con.execute(f"ATTACH {literal} AS source (READ_ONLY)")
        for copy in range(copies):
            con.execute(
                "INSERT INTO chunks SELECT * REPLACE (id || ? AS id) FROM source.chunks",
                [f"-{copy}"],
            )
        con.execute("DETACH source")
        return int(con.execute("SELECT count(*) FROM chunks").fetchone()[0])


def build(store: Path, way: str) -> dict[str, object]:
    """One build on `store`, timed in this process."""
    import resource
    import time

    from memory_dag.index.chunks_fts import SCHEMA, rebuild_chunks_fts, refresh_chunks_fts
    from memory_dag.store.connection import load_fts, open_store

    with open_store(store) as con:
        load_fts(con)
        started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if way == "pragma":
            rebuild_chunks_fts(con)
        else:
            assert refresh_chunks_fts(con) == "rebuilt"
        after = resource.getrusage(resource.RUSAGE_SELF)
        seconds = time.perf_counter() - started
        digest = con.execute(
            f"SELECT (SELECT num_docs FROM {SCHEMA}.stats), (SELECT avgdl FROM {SCHEMA}.stats), "
            f"(SELECT sum(hash(name, len)) FROM {SCHEMA}.docs)::VARCHAR, "
            f"(SELECT sum(hash(term, df)) FROM {SCHEMA}.dict)::VARCHAR, "
            f"(SELECT sum(hash(d.name, w.term)) FROM {SCHEMA}.terms t "
            f"JOIN {SCHEMA}.docs d USING (docid) JOIN {SCHEMA}.dict w USING (termid))::VARCHAR"
        ).fetchone()
    return {
        "seconds": round(seconds, 2),
        "cpu": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
        "rss_gb": round(after.ru_maxrss / 1e6, 2),
        "index": [str(value) for value in digest],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, help="a store memory-dag ingest built")
    parser.add_argument("--copies", default="1,10", help="sizes, as copies of its chunks")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tmp", type=Path, default=None, help="where the stores are made")
    parser.add_argument("--build", nargs=2, metavar=("STORE", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build(Path(args.build[0]), args.build[1])))
        return
    if args.store is None:
        parser.error("--store is required")
    work = Path(tempfile.mkdtemp(prefix="fts-build-", dir=args.tmp))
    try:
        for copies in [int(part) for part in args.copies.split(",")]:
            base = work / f"chunks-x{copies}.duckdb"
            chunks = make_store(args.store.resolve(), base, copies)
            print(f"=== {chunks:,} chunks ({copies} x the store's)", flush=True)
            results: dict[str, list[dict[str, object]]] = {way: [] for way in _WAYS}
            for repeat in range(args.repeats):
                for way in _WAYS:
                    store = work / "build.duckdb"
                    shutil.copy(base, store)
                    done = subprocess.run(
                        [sys.executable, __file__, "--build", str(store), way],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    results[way].append(result)
                    store.unlink()
                    print(
                        f"  [{repeat + 1}/{args.repeats}] {way:6}  {result['seconds']:6.2f} s, "
                        f"{result['cpu']:6.2f} CPU s, peak RSS {result['rss_gb']:.2f} GB",
                        flush=True,
                    )
            for way in _WAYS:
                runs = results[way]
                print(
                    f"  median  {way:6}  {statistics.median(r['seconds'] for r in runs):6.2f} s, "
                    f"{statistics.median(r['cpu'] for r in runs):6.2f} CPU s"
                )
            first = results["pragma"][0]["index"]
            same = all(run["index"] == first for way in _WAYS for run in results[way])
            print(f"  the same documents, terms and df both ways: {same}")
            base.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
