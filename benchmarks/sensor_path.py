"""The sensor path, timed: a new session file → searchable, with the Dagster daemon running.

Used by `whole_graph.py` (`--sensor-size`). It builds the store with `memory-dag ingest`
under a Dagster instance of its own (the project's dagster.yaml), starts `dagster-daemon run`
on the project's workspace.yaml with the code location pointed at that store
(`MEMORY_DAG_*`), waits for the sensors' first ticks and their runs, then writes one new
20-turn session file into a conversation. The clock starts when the file has settled (the
sensors' 1.5 s debounce after it was written) and stops when a warm reader's search scoped
to that conversation finds the new turn (laid beside the published version by the chunks
stage, or in a new version). The runs the sensors launched are
then read from the instance: their partitions and what facts, entities and summaries say
they recomputed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEBOUNCE_SECONDS = 1.5  # sensors/workspace.py
TIMEOUT = 300.0
RECOMPUTED_ASSETS = ("facts", "entities", "conversation_summaries")


def measure(
    workspace: Path, store: Path, names: dict[str, tuple[str, str]], target: str, home: Path
) -> dict[str, Any]:
    from whole_graph import load, measured, memory_dag_command, new_session  # the driver

    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MEMORY_DAG_WORKSPACE": str(workspace),
        "MEMORY_DAG_DB": str(store / "memory.duckdb"),
        "MEMORY_DAG_INDEX_DIR": str(store / "index"),
    }
    built = measured(memory_dag_command(workspace, store), env)
    print(
        f"\nsensor path: store built in {built['seconds']:.1f} s; starting the daemon", flush=True
    )
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        settled_runs = _wait_for_quiet(home, minimum_runs=1, quiet_seconds=QUIET_SECONDS)
        print(f"  the sensors' first runs are done ({settled_runs} runs)", flush=True)
        _reader(store).search("warm up", k=1)  # a warm reader, as a service holds one
        written = time.time()
        # A word no earlier measurement in this store used (a store is measured again).
        marker = "zebra" + "".join(random.choices(string.ascii_lowercase, k=8))
        path = new_session(workspace, target, names[target], marker)
        settled = written + DEBOUNCE_SECONDS
        searchable = _wait_until_searchable(store, target, marker, settled)
        _wait_for_quiet(home, minimum_runs=0)
        runs = _runs_since(home, written)
        path.unlink()
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
    return {
        "searchable_after_settle_s": round(searchable - settled, 2),
        "load": load(),
        "runs": runs,
        "conversation": target,
    }


#: Quiet this long before the new file is written: longer than the slowest sensor's interval
#: (60 s), so every sensor has made its first evaluation (a fresh cursor) and run it asked for.
QUIET_SECONDS = 65


def _wait_for_quiet(home: Path, minimum_runs: int, quiet_seconds: float = 6) -> int:
    """Until at least `minimum_runs` runs exist and none is queued or running for
    `quiet_seconds`."""
    import dagster as dg
    from whole_graph import open_instance

    deadline = time.monotonic() + TIMEOUT
    quiet_since = None
    while time.monotonic() < deadline:
        with open_instance(home) as instance:
            runs = instance.get_runs()
        busy = [r for r in runs if not r.is_finished]
        if len(runs) >= minimum_runs and not busy:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > quiet_seconds:
                failed = [r.run_id for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
                if failed:
                    raise RuntimeError(f"sensor runs failed: {failed}")
                return len(runs)
        else:
            quiet_since = None
        time.sleep(0.5)
    raise TimeoutError("the daemon's runs did not finish")


def _wait_until_searchable(store: Path, conversation: str, marker: str, since: float) -> float:
    """When a scoped search by a warm reader (`get_searcher`, as a service's) first finds
    `marker`: laid beside the published version by the chunks stage (the delta segment) or
    in a newly published version."""
    from memory_dag.index.search import SearchFilters

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        hits = _reader(store).search(
            marker, k=3, filters=SearchFilters(conversation=conversation), min_score=0.0
        )
        if any(marker in hit.snippet for hit in hits):
            return time.time()
        time.sleep(0.2)
    raise TimeoutError(f"{marker} did not become searchable within {TIMEOUT:.0f} s of {since}")


def _reader(store: Path) -> Any:
    """The process's searcher of the store's current version (`get_searcher`: cached, it
    notices a new version and the delta segment's new records)."""
    from memory_dag.config import Settings
    from memory_dag.index.search import get_searcher

    settings = Settings(workspace=store, db_path=store / "memory.duckdb", index_dir=store / "index")
    return get_searcher(settings)


def _runs_since(home: Path, since: float) -> list[dict[str, Any]]:
    """The runs created after `since`: their job, partitions, seconds and what they redid."""
    from whole_graph import open_instance

    out = []
    with open_instance(home) as instance:
        for record in instance.get_run_records():
            if record.create_timestamp.timestamp() < since:
                continue
            run = record.dagster_run
            recomputed: dict[str, Any] = {}
            #: When each step started, in seconds after `since` (where the time goes).
            step_starts: dict[str, float] = {}
            for entry in instance.all_logs(run.run_id):
                event = entry.dagster_event
                if event is not None and event.event_type_value == "STEP_START":
                    step_starts[event.step_key or "?"] = round(entry.timestamp - since, 2)
                if event is None or event.event_type_value != "ASSET_MATERIALIZATION":
                    continue
                materialization = event.event_specific_data.materialization
                name = materialization.asset_key.to_user_string()
                if name not in RECOMPUTED_ASSETS:
                    continue
                metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
                item = recomputed.setdefault(name, {"partitions": []})
                if materialization.partition:
                    item["partitions"].append(materialization.partition)
                item["recomputed_conversations"] = metadata.get("recomputed_conversations", "")
                for key in ("sessions_consolidated", "memories_linked", "summarized", "seconds"):
                    if key in metadata:
                        item[key] = metadata[key]
            out.append(
                {
                    "job": run.job_name,
                    "status": run.status.value,
                    "sensor": run.tags.get("dagster/sensor_name"),
                    "partitions": [
                        run.tags.get("dagster/asset_partition_range_start"),
                        run.tags.get("dagster/asset_partition_range_end"),
                    ],
                    "seconds": round((record.end_time or 0) - (record.start_time or 0), 2),
                    "created_s": round(record.create_timestamp.timestamp() - since, 2),
                    "started_s": round((record.start_time or since) - since, 2),
                    "step_starts_s": step_starts,
                    "recomputed": recomputed,
                }
            )
    return out


def report(result: dict[str, Any]) -> None:
    print(
        f"  one new session file → searchable {result['searchable_after_settle_s']:.1f} s after "
        f"the file settled (conversation {result['conversation']}, load {result['load']})"
    )
    for run in result["runs"]:
        print(
            f"  run of {run['job']} by {run['sensor']}: {run['status']}, {run['seconds']} s, "
            f"partitions {run['partitions'][0]}..{run['partitions'][1]}; seconds after the file "
            f"was written: asked for {run['created_s']}, started {run['started_s']}, steps "
            + ", ".join(f"{key} {at}" for key, at in run["step_starts_s"].items())
        )
        for asset, item in run["recomputed"].items():
            details = json.dumps({k: v for k, v in item.items() if k != "partitions"})
            print(f"    {asset}: partitions {_shown(item['partitions'])} {details}")


def _shown(partitions: list[str] | None) -> str:
    """A run's partitions, short: the count and the first few."""
    if not partitions:
        return "-"
    if len(partitions) <= 3:
        return ", ".join(partitions)
    return f"{len(partitions)} ({', '.join(sorted(partitions)[:3])}, …)"


def main() -> None:
    """The sensor path alone, on a generated workspace and a store already built from it:

        python benchmarks/sensor_path.py --size 100000 --root /tmp/sensor-100k

    writes the corpus (`whole_graph.py`'s generator, 500 turns a conversation) under
    `ROOT/workspace` unless it is there, builds `ROOT/store` with `memory-dag ingest` (a run
    with nothing to do when it is already built) and measures as `whole_graph.py
    --sensor-size` does, with a fresh Dagster instance in `ROOT/dagster_home`.
    """
    import argparse
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ingest_search as corpus_generator
    from whole_graph import fresh_dagster_home

    parser = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--turns-per-conversation", type=int, default=500)
    args = parser.parse_args()
    workspace = args.root / "workspace"
    conversations = max(1, args.size // args.turns_per_conversation)
    sentences, pairs, _ = corpus_generator.load_locomo(corpus_generator.LOCOMO_DIR)
    if not workspace.exists():
        corpus_generator.write_corpus(
            workspace,
            args.size,
            sentences,
            pairs,
            0,
            conversations=conversations,
            turns_per_session=20,
        )
    width = max(2, len(str(conversations - 1)))
    names = {
        f"conv-{c:0{width}d}": pair
        for c, pair in enumerate(corpus_generator.names_for(pairs, conversations))
    }
    target = sorted(names)[len(names) // 2]
    home = args.root / "dagster_home"
    shutil.rmtree(home, ignore_errors=True)
    print(f"sensor path at {args.size:,} turns, load {os.getloadavg()}", flush=True)
    result = measure(workspace, args.root / "store", names, target, fresh_dagster_home(args.root))
    report(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
