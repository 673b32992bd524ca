"""The whole asset graph on the user's path, beside the systems it replaces (issue 15).

    python benchmarks/whole_graph.py [--sizes 10000,100000] [--repeats 3]
        [--systems memory-dag,sqlite-vec,lancedb,chromadb] [--peer-max-size 100000]
        [--turns-per-conversation 500] [--turns-per-session 20] [--queries 200]
        [--sensor-size 100000] [--no-recall] [--plots docs] [--json FILE] [--tmp DIR]

For every size, one corpus from `ingest_search.py`'s generator (LoCoMo sentences recombined;
`--turns-per-conversation` turns a conversation, `--turns-per-session` a session file). Then,
`--repeats` times, the systems one after the other (the order rotates each repeat), each in
its own processes, so memory and imports are its own:

* ingest: memory-dag as a user runs it, `memory-dag ingest` (the whole Dagster job: files,
  chunks, facts, entities, summaries, embeddings, both indexes and every check; a fresh
  Dagster instance with the project's dagster.yaml); the peers (`peers.py`) with seed 002's
  sync. Every system computes its WordLlama vectors inside the timed region.
* the same again with nothing changed; then one new 20-turn session in one conversation;
* warm search, p50 / p95, unscoped and scoped to one conversation (`--queries` queries: LoCoMo
  questions with the names mapped, and turn prefixes);
* peak RSS and CPU seconds of the process tree (sampled every 0.1 s) and bytes on disk.

Medians over repeats and ratios to memory-dag are printed, with the load average measured
beside each figure and WordLlama's own embed rate (how fast the machine is today). For
memory-dag the seconds of each asset come from its run, and orchestration is the run's wall
time minus the library's seconds; each step's CPU seconds (worker processes included) show
how many of the cores it kept busy, and the main process's own CPU seconds (its threads
included) how much of the run it carried alone. At `--sensor-size` the sensor path is
measured with the Dagster daemon running: a new session file → searchable, and what that run
recomputed. Then recall@10 of each system on `--data` (LoCoMo dev), and PNG plots
(throughput and search latency against corpus size, one line per system; memory-dag's cores
busy over its ingest of the largest size, step by step, the main process's share a second
line) into `--plots`.

Kept as one script (~600 lines): the runs, their medians, the table and the plots share one
record layout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest_search as corpus_generator  # noqa: E402  (the benchmarks folder is no package)
import numpy as np  # noqa: E402
import sensor_path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().parent / "peers.py"
SYSTEMS = ["memory-dag", "sqlite-vec", "lancedb", "chromadb"]
#: The library's own seconds in each asset's materialization (the rest is orchestration).
LIBRARY_ASSETS = [
    "workspace_files",
    "chunks",
    "facts",
    "entities",
    "conversation_summaries",
    "chunk_embeddings",
]


def load() -> float:
    return round(os.getloadavg()[0], 2)


# --- running one measured process --------------------------------------------------------------


def measured(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `command`; wall seconds, peak RSS of its process tree (GB), its last JSON line, and
    the tree's CPU seconds over time (`cpu`: (time, CPU seconds so far) every 0.1 s), and the
    command's own process's, its threads included (`main_cpu`, the same way)."""
    import psutil

    started = time.perf_counter()
    before = load()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    peak, peak_at = 0, 0.0
    cpu: list[tuple[float, float]] = []
    main_cpu: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_at
        while not done.is_set():
            try:
                root = psutil.Process(process.pid)
                tree = [root, *root.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree if p.is_running())
                if rss > peak:
                    peak, peak_at = rss, time.time()
                now = time.time()
                cpu.append((now, cpu_seconds(tree)))  # the tree listed once
                main_cpu.append((now, cpu_seconds([root], ended_children=False)))
            except psutil.Error:
                pass
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.strip()]
    result = json.loads(out[out.index("{") :]) if command[-1] == "--json" else json.loads(lines[-1])
    return {
        "seconds": seconds,
        "rss_gb": peak / 1e9,
        "peak_at": peak_at,
        "load": before,
        "result": result,
        "cpu": cpu,
        "main_cpu": main_cpu,
    }


def tree_cpu_seconds(root: Any, *, descendants: bool = True) -> float:
    """User + system CPU seconds of `root` and its descendants, ended children included."""
    if not descendants:
        return cpu_seconds([root], ended_children=False)
    return cpu_seconds([root, *root.children(recursive=True)])


def cpu_seconds(processes: list[Any], *, ended_children: bool = True) -> float:
    """User + system CPU seconds of `processes`, and of their ended (reaped) children."""
    import psutil

    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        if ended_children:
            total += times.children_user + times.children_system
    return total


def cpu_between(cpu: list[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds the process tree used from `start` to `end` (its samples interpolated)."""
    if len(cpu) < 2:
        return float("nan")
    times, totals = zip(*cpu, strict=True)
    return float(np.interp(end, times, totals) - np.interp(start, times, totals))


def memory_dag_command(workspace: Path, store: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "memory-dag"),
        "ingest",
        "--workspace",
        str(workspace),
        "--db",
        str(store / "memory.duckdb"),
        "--index-dir",
        str(store / "index"),
        "--json",
    ]


def fresh_dagster_home(root: Path) -> Path:
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "data" / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    return home


def ingest(system: str, workspace: Path, store: Path, home: Path) -> dict[str, Any]:
    if system == "memory-dag":
        env = {**os.environ, "DAGSTER_HOME": str(home)}
        started = time.time()
        run = measured(memory_dag_command(workspace, store), env)
        run["assets"] = asset_seconds(run["result"]["stages"])
        run["steps"], spans = step_seconds(home, since=started)
        run["step_cpu"] = {key: cpu_between(run["cpu"], *span) for key, span in spans.items()}
        run["spans"] = spans
        run["peak_step"] = next(
            (step for step, (start, end) in spans.items() if start <= run["peak_at"] <= end),
            "between steps",
        )
        library = sum(run["assets"].values())
        run["orchestration"] = run["seconds"] - library
        return run
    return measured(
        [sys.executable, str(PEERS), system, "sync", "--workspace", str(workspace)]
        + ["--store", str(store)]
    )


def asset_seconds(stages: dict[str, Any]) -> dict[str, float]:
    """Library seconds per asset. The two indexes share a step: built side by side, its
    library time is the longer of the two; above `FTS_BESIDE_MAX_CHUNKS` chunks the FTS index
    is built after the search index (for memory), and the step takes both."""
    seconds = {name: float(stages[name]["seconds"]) for name in LIBRARY_ASSETS if name in stages}
    built = [float(stages[n]["seconds"]) for n in ("search_index", "chunks_fts") if n in stages]
    fts = stages.get("chunks_fts", {})  # the Dagster run's metadata, or the library's report
    fts_counts = {**(fts.get("counts") or {}), **fts}
    if built:
        beside = bool(fts_counts.get("beside_search_index", 1))
        seconds["indexes"] = max(built) if beside else sum(built)
    return seconds


def open_instance(home: Path) -> Any:
    """The Dagster instance in `home` (quietly: it logs a line per storage it opens)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from memory_dag.dagster_event_log import open_instance as open_in

    return open_in(home)


def run_step_spans(instance: Any, run_id: str) -> dict[str, tuple[float, float]]:
    """Each succeeded step's (start, end) time in one run, from Dagster's own events."""
    starts: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.event_type_value == "STEP_START":
            starts[event.step_key] = entry.timestamp
        elif event.event_type_value == "STEP_SUCCESS":
            spans[event.step_key] = (starts.get(event.step_key, 0.0), entry.timestamp)
    return spans


def step_seconds(
    home: Path, since: float
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Seconds of each step of the instance's last run, from Dagster's own events, and each
    step's (start, end) time; nothing when no run began after `since` (a command that found
    nothing to do launches none)."""
    with open_instance(home) as instance:
        records = instance.get_run_records(limit=1)
        if not records or records[0].create_timestamp.timestamp() < since:
            return {}, {}
        run = records[0].dagster_run
        spans = run_step_spans(instance, run.run_id)
        steps = {key: round(end - start, 3) for key, (start, end) in spans.items()}
        record = instance.get_run_record_by_id(run.run_id)
        if record is not None and record.start_time and record.end_time:
            steps["(run)"] = round(record.end_time - record.start_time, 3)
    return steps, spans


def search(system: str, store: Path, queries: Path) -> dict[str, Any]:
    return measured(
        [sys.executable, str(PEERS), system, "search", "--store", str(store)]
        + ["--queries", str(queries)]
    )


def disk_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# --- one size ----------------------------------------------------------------------------------


def new_session(workspace: Path, conversation: str, names: tuple[str, str], marker: str) -> Path:
    """A 20-turn session file at the end of `conversation`; one turn says `marker`."""
    folder = workspace / "sessions" / conversation
    path = folder / "session-9999.jsonl"
    when = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    lines = []
    for turn in range(20):
        content = f"We talked about {marker} again." if turn == 10 else f"New turn {turn} here."
        lines.append(
            json.dumps(
                {
                    "type": "message",
                    "id": f"new-t{turn}",
                    "role": "user" if turn % 2 == 0 else "assistant",
                    "name": names[turn % 2],
                    "content": content,
                    "created_at": when.replace(minute=turn).isoformat(),
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def bench_size(size: int, args: argparse.Namespace, data: Any) -> dict[str, Any]:
    sentences, pairs, questions = data
    root = Path(tempfile.mkdtemp(prefix=f"whole-graph-{size}-", dir=args.tmp))
    workspace = root / "workspace"
    conversations = max(1, size // args.turns_per_conversation)
    started = time.perf_counter()
    names, samples = corpus_generator.write_corpus(
        workspace,
        size,
        sentences,
        pairs,
        args.seed,
        conversations=conversations,
        turns_per_session=args.turns_per_session,
    )
    import random

    queries = corpus_generator.make_queries(
        questions, samples, names, args.queries, random.Random(args.seed + 1)
    )
    queries_file = root / "queries.json"
    queries_file.write_text(json.dumps(queries))
    print(
        f"\n=== {size:,} turns: {conversations:,} conversations of "
        f"{args.turns_per_conversation} turns, {args.turns_per_session} a session file "
        f"(corpus written in {time.perf_counter() - started:.1f} s) ===",
        flush=True,
    )
    systems = [s for s in args.systems if s == "memory-dag" or size <= args.peer_max_size]
    target = sorted(names)[len(names) // 2]
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    for repeat in range(args.repeats):
        order = systems[repeat % len(systems) :] + systems[: repeat % len(systems)]
        for system in order:
            store = root / f"{system}-{repeat}"
            home = fresh_dagster_home(store)
            cold = ingest(system, workspace, store, home)
            again = ingest(system, workspace, store, home)
            added = new_session(workspace, target, names[target], f"zebra-{repeat}")
            try:
                one = ingest(system, workspace, store, home)
            finally:
                added.unlink()
            found = search(system, store, queries_file)
            record = {
                "cold": cold,
                "again": again,
                "one_session": one,
                "search": found,
                "disk_bytes": disk_bytes(store),
            }
            runs[system].append(record)
            print(
                f"  [{repeat + 1}/{args.repeats}] {system:<11} ingest {cold['seconds']:8.1f} s "
                f"(load {cold['load']}), again {again['seconds']:6.2f} s, one session "
                f"{one['seconds']:6.2f} s, search p50 {found['result']['scoped_p50_ms']:.2f} / "
                f"{found['result']['unscoped_p50_ms']:.2f} ms, RSS {cold['rss_gb']:.2f} GB, "
                f"disk {record['disk_bytes'] / 1e9:.2f} GB",
                flush=True,
            )
            if not args.keep:
                shutil.rmtree(store, ignore_errors=True)
    summary = summarize(size, runs)
    print_size(summary)
    if size == args.sensor_size and "memory-dag" in systems:
        summary["sensor"] = sensor_path.measure(
            workspace, root / "sensor", names, target, fresh_dagster_home(root / "sensor")
        )
        sensor_path.report(summary["sensor"])
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return summary


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(size: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over repeats, per system."""
    out: dict[str, Any] = {"size": size, "systems": {}}
    for system, records in runs.items():
        row = {
            "ingest_s": median([r["cold"]["seconds"] for r in records]),
            "again_s": median([r["again"]["seconds"] for r in records]),
            "one_session_s": median([r["one_session"]["seconds"] for r in records]),
            "rss_gb": median([r["cold"]["rss_gb"] for r in records]),
            "disk_gb": median([r["disk_bytes"] / 1e9 for r in records]),
            "load": median([r["cold"]["load"] for r in records]),
            "repeats": len(records),
        }
        for key in ("scoped_p50_ms", "scoped_p95_ms", "unscoped_p50_ms", "unscoped_p95_ms"):
            row[key] = median([r["search"]["result"][key] for r in records])
        row["turns_per_s"] = size / row["ingest_s"]
        if system == "memory-dag":
            assets = sorted({a for r in records for a in r["cold"]["assets"]})
            row["assets_s"] = {
                a: median([r["cold"]["assets"].get(a, 0) for r in records]) for a in assets
            }
            steps = sorted({a for r in records for a in r["cold"]["steps"]})
            row["steps_s"] = {
                s: median([r["cold"]["steps"].get(s, 0) for r in records]) for s in steps
            }
            row["step_cpu_s"] = {
                s: median([r["cold"]["step_cpu"].get(s, 0) for r in records]) for s in steps
            }
            row["cpu_s"] = median([r["cold"]["cpu"][-1][1] for r in records if r["cold"]["cpu"]])
            row["main_cpu_s"] = median(
                [r["cold"]["main_cpu"][-1][1] for r in records if r["cold"]["main_cpu"]]
            )
            last = records[-1]["cold"]
            row["cpu_timeline"] = {
                "cpu": last["cpu"],
                "main_cpu": last["main_cpu"],
                "spans": last["spans"],
            }
            row["orchestration_s"] = median([r["cold"]["orchestration"] for r in records])
            row["again_run_s"] = median([r["again"]["steps"].get("(run)", 0) for r in records])
            row["again_instance"] = (
                records[-1]["again"]["result"]["stages"].get("workspace_files", {}).get("instance")
            )
            row["one_session_recomputed"] = records[-1]["one_session"]["result"]["stages"]
            row["peak_step"] = records[-1]["cold"]["peak_step"]
        out["systems"][system] = row
    return out


def print_size(summary: dict[str, Any]) -> None:
    size, systems = summary["size"], summary["systems"]
    base = systems.get("memory-dag")
    print(f"\nmedians at {size:,} turns (ratio: the system's figure / memory-dag's)")
    header = (
        f"  {'system':<11} {'ingest s':>9} {'turns/s':>8} {'again s':>8} {'1 session s':>11} "
        f"{'scoped p50/p95 ms':>18} {'unscoped p50/p95 ms':>20} {'RSS GB':>7} {'disk GB':>8} "
        f"{'load':>5}"
    )
    print(header)
    for system, row in systems.items():
        print(
            f"  {system:<11} {row['ingest_s']:9.1f} {row['turns_per_s']:8,.0f} "
            f"{row['again_s']:8.2f} {row['one_session_s']:11.2f} "
            f"{row['scoped_p50_ms']:8.2f} /{row['scoped_p95_ms']:8.2f} "
            f"{row['unscoped_p50_ms']:9.2f} /{row['unscoped_p95_ms']:8.2f} "
            f"{row['rss_gb']:7.2f} {row['disk_gb']:8.2f} {row['load']:5.2f}"
        )
        if base is not None and system != "memory-dag":
            ratios = {
                key: row[key] / base[key] if base[key] else float("nan")
                for key in ("ingest_s", "again_s", "one_session_s", "scoped_p50_ms")
                + ("unscoped_p50_ms", "rss_gb", "disk_gb")
            }
            print(
                "  "
                + " " * 11
                + "  ratio: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            )
    if base is not None:
        library = sum(base["assets_s"].values())
        print(
            "  memory-dag, each asset's library seconds (median): "
            + ", ".join(f"{name} {seconds:.2f}" for name, seconds in base["assets_s"].items())
        )
        print(
            "  memory-dag, each Dagster step's seconds (median): "
            + ", ".join(f"{name} {seconds:.2f}" for name, seconds in base["steps_s"].items())
        )
        cores = usable_cores()
        print(
            f"  memory-dag, CPU seconds of the whole process tree: {base['cpu_s']:.1f} "
            f"({base['cpu_s'] / base['ingest_s']:.2f} of {cores} cores busy on average); each "
            "step's (median; cores busy during it): "
            + ", ".join(
                f"{name} {cpu:.1f} ({cpu / base['steps_s'][name]:.2f})"
                for name, cpu in sorted(base["step_cpu_s"].items(), key=lambda item: -item[1])
                if name != "(run)" and base["steps_s"].get(name)
            )
        )
        main = base["main_cpu_s"]
        print(
            f"  memory-dag, CPU seconds of the main process (its threads included): {main:.1f}, "
            f"{main / base['ingest_s']:.2f} cores busy on average; of its worker processes: "
            f"{base['cpu_s'] - main:.1f}"
        )
        share = base["orchestration_s"] / base["ingest_s"] * 100
        print(
            f"  memory-dag: end to end {base['ingest_s']:.1f} s = library {library:.1f} s + "
            f"orchestration {base['orchestration_s']:.1f} s ({share:.0f}%: process start, "
            f"imports, the run's set-up and events, checks); nothing-changed run "
            f"{base['again_s']:.2f} s end to end ("
            + (
                f"{base['again_run_s']:.2f} s of it the run"
                if base["again_run_s"]
                else "no run launched; the finding was "
                + (
                    "already in the instance: Dagster not loaded"
                    if base.get("again_instance") == "already recorded"
                    else "recorded as a runless observation in the instance"
                )
            )
            + "); "
            f"peak RSS {base['rss_gb']:.2f} GB, during {base['peak_step']}"
        )


# --- plots -------------------------------------------------------------------------------------


def plot(results: list[dict[str, Any]], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    systems = sorted({s for r in results for s in r["systems"]}, key=SYSTEMS.index)
    written = []
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for system in systems:
        points = [
            (r["size"], r["systems"][system]["turns_per_s"])
            for r in results
            if system in r["systems"]
        ]
        axis.plot(*zip(*points, strict=True), marker="o", label=system)
    axis.set(xscale="log", xlabel="turns in the corpus", ylabel="turns / s, ingest end to end")
    axis.set_title("Ingest throughput (memory-dag: the whole graph)")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    written.append(folder / "whole_graph_throughput.png")
    figure.savefig(written[-1], dpi=120)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for axis, scope in zip(axes, ("scoped", "unscoped"), strict=True):
        for system in systems:
            points = [
                (r["size"], r["systems"][system][f"{scope}_p50_ms"])
                for r in results
                if system in r["systems"]
            ]
            axis.plot(*zip(*points, strict=True), marker="o", label=system)
        axis.set(xscale="log", yscale="log", xlabel="turns in the corpus")
        axis.set_title(f"search p50, {scope}")
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[0].legend()
    figure.tight_layout()
    written.append(folder / "whole_graph_search_latency.png")
    figure.savefig(written[-1], dpi=120)
    largest = max(results, key=lambda r: r["size"])["systems"].get("memory-dag")
    if largest and len(largest["cpu_timeline"]["cpu"]) > 2:
        written.append(folder / "whole_graph_cpu_timeline.png")
        cpu_timeline(largest, max(r["size"] for r in results), written[-1], plt)
    return written


def cpu_timeline(row: dict[str, Any], size: int, path: Path, plt: Any) -> None:
    """Cores busy over one memory-dag ingest, each Dagster step a band: where the two cores
    are idle is where the run waits on one core; the main process's own line shows where
    it is that core (the worker processes idle)."""
    times, busy = cores_busy(row["cpu_timeline"]["cpu"])
    start = times[0]
    figure, axis = plt.subplots(figsize=(10, 4.2))
    axis.step(times[1:] - start, busy, where="pre", color="black", linewidth=0.8, label="all")
    main = row["cpu_timeline"].get("main_cpu") or []
    if len(main) > 2:
        main_times, main_busy = cores_busy(main)
        axis.step(
            main_times[1:] - start,
            main_busy,
            where="pre",
            color="tab:red",
            linewidth=0.7,
            alpha=0.8,
            label="the main process (its threads included)",
        )
        axis.legend(loc="upper right", fontsize=8)
    spans = sorted(row["cpu_timeline"]["spans"].items(), key=lambda item: item[1][0])
    for number, (step, (begin, end)) in enumerate(spans):
        axis.axvspan(begin - start, end - start, alpha=0.15, color=f"C{number % 10}")
        if end - begin > 1.5:
            axis.text((begin + end) / 2 - start, 0.1, step, rotation=90, fontsize=8, ha="center")
    axis.axhline(usable_cores(), color="grey", linestyle="--", linewidth=0.8)
    axis.set_ylim(0, usable_cores() + 0.4)
    axis.set(xlabel="seconds since the command started", ylabel="cores busy (process tree)")
    axis.set_title(f"memory-dag ingest of {size:,} turns: cores busy, step by step")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def cores_busy(samples: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The sample times, and the cores busy between each sample and the next (from
    (time, CPU seconds so far) samples)."""
    times, totals = (np.asarray(v) for v in zip(*samples, strict=True))
    return times, np.diff(totals) / np.maximum(np.diff(times), 1e-9)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def recall(systems: list[str], data: Path, tmp: str | None) -> dict[str, Any]:
    out = {}
    for system in systems:
        with tempfile.TemporaryDirectory(prefix=f"recall-{system}-", dir=tmp) as store:
            run = measured(
                [sys.executable, str(PEERS), system, "recall", "--locomo", str(data)]
                + ["--store", store]
            )
            out[system] = run["result"]
            print(
                f"  {system:<11} recall@10 {run['result']['recall_at_10']:.3f} "
                f"({run['result']['questions']} questions, load {run['load']})",
                flush=True,
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--peer-max-size", type=int, default=100_000)
    parser.add_argument("--turns-per-conversation", type=int, default=500)
    parser.add_argument("--turns-per-session", type=int, default=20)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--sensor-size", type=int, default=100_000, help="0: no sensor path")
    parser.add_argument("--no-recall", action="store_true")
    parser.add_argument("--plots", type=Path, default=REPO / "docs")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--data", type=Path, default=corpus_generator.LOCOMO_DIR)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.systems = [s for s in args.systems.split(",") if s]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    import duckdb
    import wordllama

    print(
        f"whole-graph benchmark  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cpus, duckdb {duckdb.__version__}, "
        f"wordllama {getattr(wordllama, '__version__', '?')}; sizes {sizes}, "
        f"{args.repeats} repeats, systems {', '.join(args.systems)}"
    )
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    data = corpus_generator.load_locomo(args.data)
    rate = corpus_generator.wordllama_rate(data[0], args.seed)
    speed = rate / corpus_generator.REFERENCE_WORDLLAMA_RATE
    print(
        f"machine speed: WordLlama's own embed runs at {rate:,.0f} texts/s ({speed:.2f}x the "
        f"{corpus_generator.REFERENCE_WORDLLAMA_RATE:,}/s the aims were set against; "
        f"load {load()})",
        flush=True,
    )
    results = [bench_size(size, args, data) for size in sizes]
    recalls = {}
    if not args.no_recall:
        print(f"\nrecall@10 on {args.data} (one turn = one document, scoped to the conversation)")
        recalls = recall(args.systems, args.data, args.tmp)
    if len(results) >= 1:
        for path in plot(results, args.plots):
            print(f"plot: {path}")
    print(f"\nload average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"wordllama_rate": rate, "sizes": results, "recall": recalls}
        args.json.write_text(json.dumps(document, indent=1, default=str))


if __name__ == "__main__":
    main()
