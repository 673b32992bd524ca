"""What opening the published index costs: `memory-dag search` end to end, and `load_index`.

    python benchmarks/index_open.py STORE_DIR [--repeats R] [--query TEXT] [--json]

STORE_DIR holds `memory.duckdb` and `index/` as `memory-dag ingest` made them (for issue 15's
figures: the 100k- or 1M-turn store of `benchmarks/whole_graph.py --keep`); `--workspace`
names its workspace when it is not `STORE_DIR/../workspace`. Nothing is written.

Every process that reads the index loads its current version whole (`published.load_index`):
each `memory-dag search`, `query` or `context` command, and a running service or MCP server
whenever a run published a new version (the next request waits for it). So it prints, each a
median of `--repeats` runs in fresh processes:

1. **`memory-dag search QUERY`**, wall seconds and peak RSS of the command, as a user runs it.
2. **`load_index`** alone, in a fresh process after its imports: seconds and the process's
   peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_LOAD = """
import json, sys, time, resource
from pathlib import Path
from memory_dag.index.published import load_index
started = time.perf_counter()
index = load_index(Path(sys.argv[1]))
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "rows": index.size,
                  "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}))
"""


def search_once(store: Path, workspace: Path, query: str) -> dict[str, float]:
    """One `memory-dag search` command: wall seconds and the child's peak RSS."""
    command = [
        str(Path(sys.executable).parent / "memory-dag"),
        "search",
        query,
        "--workspace",
        str(workspace),
        "--db",
        str(store / "memory.duckdb"),
        "--index-dir",
        str(store / "index"),
        "--limit",
        "5",
    ]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The pipes are small (5 results), so waiting before reading them cannot block; wait4
    # gives this child's own peak RSS (RUSAGE_CHILDREN is the largest of all children so far).
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    out, err = child.stdout.read(), child.stderr.read()  # type: ignore[union-attr]
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"memory-dag search failed ({child.returncode}):\n{err.decode()}")
    return {"seconds": seconds, "rss_gb": usage.ru_maxrss / 1e6, "lines": out.count(b"\n")}


def load_once(store: Path) -> dict[str, float]:
    """`load_index` in a fresh process, timed inside it (imports not counted)."""
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(store / "index")],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path, help="folder with memory.duckdb and index/")
    parser.add_argument("--workspace", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--query", default="what did Maria paint")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    store = args.store
    workspace = args.workspace or store.parent / "workspace"
    searches, loads = [], []
    for repeat in range(args.repeats):  # alternating, so host noise falls on both
        searches.append(search_once(store, workspace, args.query))
        loads.append(load_once(store))
        print(
            f"[{repeat + 1}/{args.repeats}] memory-dag search {searches[-1]['seconds']:.2f} s "
            f"(peak RSS {searches[-1]['rss_gb']:.2f} GB), load_index {loads[-1]['seconds']:.2f} s "
            f"({loads[-1]['rows']:,} rows, peak RSS {loads[-1]['rss_gb']:.2f} GB)",
            flush=True,
        )
    figures = {
        "rows": loads[0]["rows"],
        "search_s": statistics.median(s["seconds"] for s in searches),
        "search_rss_gb": statistics.median(s["rss_gb"] for s in searches),
        "load_s": statistics.median(s["seconds"] for s in loads),
        "load_rss_gb": statistics.median(s["rss_gb"] for s in loads),
    }
    print(
        f"medians of {args.repeats}: memory-dag search {figures['search_s']:.2f} s "
        f"(peak RSS {figures['search_rss_gb']:.2f} GB); load_index {figures['load_s']:.2f} s "
        f"(peak RSS {figures['load_rss_gb']:.2f} GB) for {figures['rows']:,} rows"
    )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
