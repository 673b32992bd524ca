"""Throughput of the sharded deployment with 1 and 2 Celery workers over the same 8 shards,
the nightly maintenance time per shard, and the routed search latency.

    python benchmarks/scale.py [--users-per-shard 12] [--sessions 4] [--turns 60]
                               [--cores-per-worker 1] [--workers 1,2] [--out FILE]

`--workers 1,2,1,2` alternates the settings (the machine's speed drifts during a run); the
speed-up is then the ratio of the medians.

For each worker count: a fresh PostgreSQL + Redis (deploy/local/start.sh), a fresh Dagster
instance (deploy/local/dagster.yaml, `max_concurrent_runs` = workers), the daemon and the
workers; the shard sensor routes the workspace and asks for one ingest run per shard. Ingest
throughput = the corpus's turns / the time from the corpus's arrival in the workspace (the
deployment already up: daemon, code server and workers running, the shard sensor evaluated
once) until every shard's ingest run succeeded (the whole ingest job: files, chunks, facts,
entities, the shard's conversation summaries, embeddings, indexes, with every check).
Then one `maintenance_job` run per shard is submitted (`dagster job launch`, all at once; the
queue runs as many at a time as there are workers); each run's duration and the span from the
first start to the last end are read from the instance. Also printed from the instance: each
run's asked-for / started / ended times, each step's seconds summed over a setting's runs,
and the speed-up of the runs alone (first run asked for → last run ended: without the wait
for the shard sensor's tick, which no worker count shortens).

Each worker is held to its own `--cores-per-worker` cores (`taskset`; worker i gets cores
i*c .. i*c+c-1), as one worker machine or one pod with a CPU limit would be: the speed-up of 2
workers over 1 is then what a second worker adds, not what one run's threads already took of
an idle machine (with 0, workers are not pinned and one run uses every core).
Search: `POST /v1/memories/search` through `memory-dag serve` (its own process, routing each
request to the user's shard), 200 queries over random users; and the library's routed call
for comparison. Requires PostgreSQL and redis-server (apt-get install postgresql redis-server).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import dagster as dg  # noqa: E402
import psutil  # noqa: E402
from dagster._core.scheduler.instigation import InstigatorType, TickStatus  # noqa: E402
from serving import memory_dag_serve  # noqa: E402
from whole_graph import run_step_spans, tree_cpu_seconds  # noqa: E402

from memory_dag.config import Settings  # noqa: E402
from memory_dag.index.search import search  # noqa: E402
from memory_dag.scope import Scope  # noqa: E402
from memory_dag.store.shards import SHARD_TAG, all_shard_settings, settings_for, shard_key  # noqa: E402
from tests.scale.corpus import TOPICS, users_covering, write_corpus  # noqa: E402
from tests.scale.servers import (  # noqa: E402
    BIN,
    WORKSPACE,
    Processes,
    deployment_env,
    missing_binaries,
    start_servers,
    stop_servers,
)
from tests.scale.test_distributed import reference_store, run_intervals  # noqa: E402
from tests.scale.test_shard_assets import settle  # noqa: E402
from tests.store_snapshot import differences  # noqa: E402

SHARDS = 8


def episodes(settings: Settings) -> int:
    import duckdb

    total = 0
    for shard in all_shard_settings(settings):
        with duckdb.connect(str(shard.db_path), read_only=True) as con:
            total += con.execute("SELECT count(*) FROM episodes").fetchone()[0]
    return total


def sizes(settings: Settings, turns: int) -> dict[str, float]:
    """Store and published-index bytes per turn over the shards (the current index version)."""
    store = index = 0
    for shard in all_shard_settings(settings):
        store += Path(shard.db_path).stat().st_size
        current = Path(shard.index_dir) / (Path(shard.index_dir) / "CURRENT").read_text().strip()
        index += sum(p.stat().st_size for p in current.rglob("*") if p.is_file())
    return {
        "store_bytes_per_turn": round(store / turns),
        "index_bytes_per_turn": round(index / turns),
    }


def run_seconds(instance: dg.DagsterInstance, run_id: str) -> float:
    record = instance.get_run_record_by_id(run_id)
    return float(record.end_time - record.start_time)


def shards_differing(settings: Settings, folder: Path) -> list[str]:
    """The shards whose store differs (any table, row counts and content) from a single store
    built by the library from the same users' files (the scale test's check, at this size)."""
    differing = []
    for number, shard in enumerate(all_shard_settings(settings)):
        reference = reference_store(shard, folder / f"single-{number}")
        if differences(Path(shard.db_path), reference):
            differing.append(shard_key(number))
    return differing


def run_checks(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> dict:
    """From the event log: failed runs, lock errors, and overlapping runs of one shard."""
    failed = sum(run.status != dg.DagsterRunStatus.SUCCESS for run in runs)
    lock_errors = sum(
        "lock" in str(event.message).lower() and "conflicting" in str(event.message).lower()
        for run in runs
        for event in instance.all_logs(run.run_id)
        if event.message
    )
    spans: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        spans.setdefault(run.tags[SHARD_TAG], []).append(run_intervals(instance, run.run_id))
    overlaps = 0
    for shard_spans in spans.values():
        shard_spans.sort()
        overlaps += sum(b[0] < a[1] for a, b in zip(shard_spans, shard_spans[1:], strict=False))
    return {"failed_runs": failed, "lock_errors": lock_errors, "same_shard_overlaps": overlaps}


def worker_cores(number: int, args: argparse.Namespace) -> set[int] | None:
    """The cores worker `number` is held to (None: not pinned)."""
    per = args.cores_per_worker
    if not per:
        return None
    cores = sorted(os.sched_getaffinity(0))
    return {cores[(number * per + k) % len(cores)] for k in range(per)}


def timeline(instance: dg.DagsterInstance, runs: list[dg.DagsterRun], since: float) -> str:
    """Each run's shard, asked for / started / ended in seconds after `since` (the corpus's
    arrival), in start order: where a setting's time went between and before runs. A run the
    shard sensor did not ask for names what did (a retry, another sensor, a schedule)."""
    records = [instance.get_run_record_by_id(run.run_id) for run in runs]
    rows = sorted((record.start_time or 0, record) for record in records if record is not None)
    return "; ".join(
        f"{record.dagster_run.tags.get(SHARD_TAG)} "
        f"{record.create_timestamp.timestamp() - since:.1f}/{start - since:.1f}/"
        f"{(record.end_time or start) - since:.1f}{asked_by(record.dagster_run)}"
        for start, record in rows
    )


def asked_by(run: dg.DagsterRun) -> str:
    """What asked for the run, as ` (by ...)`, when it was not the shard sensor; else ''."""
    tags = run.tags
    if tags.get("dagster/sensor_name") == "shard_workspace_sensor":
        return ""
    for key in (
        "dagster/parent_run_id",
        "dagster/sensor_name",
        "dagster/schedule_name",
        "dagster/backfill",
    ):
        if key in tags:
            return f" (by {key.split('/')[1]} {tags[key][:12]})"
    return f" (by no sensor: run key {tags.get('dagster/run_key', '-')[:40]})"


def runs_span(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> float:
    """Seconds from the first run asked for to the last run ended: the ingest without the
    wait for the sensor's tick and its routing, which no worker count changes."""
    records = [instance.get_run_record_by_id(run.run_id) for run in runs]
    first = min(record.create_timestamp.timestamp() for record in records if record)
    return round(max((record.end_time or 0) for record in records if record) - first, 1)


def where_runs_went(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> str:
    """Each step's seconds summed over `runs`, longest first, then the runs' time outside
    their steps (a run's start and end in its worker: the steps of a run execute one at a
    time, so the rest is what the run pays around them)."""
    steps: dict[str, float] = {}
    outside = 0.0
    for run in runs:
        spans = run_step_spans(instance, run.run_id)
        for key, (start, end) in spans.items():
            steps[key] = steps.get(key, 0.0) + end - start
        outside += run_seconds(instance, run.run_id) - sum(b - a for a, b in spans.values())
    ranked = sorted(steps.items(), key=lambda item: -item[1])
    return ", ".join(f"{key} {seconds:.1f}" for key, seconds in ranked) + (
        f"; outside the steps {outside:.1f}"
    )


def service_roots(servers_dir: Path, redis_url: str) -> dict[str, list[psutil.Process]]:
    """The PostgreSQL postmaster (its backends are its children), PgBouncer and redis-server
    of this setting, found by their folder and port."""
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    roots: dict[str, list[psutil.Process]] = {"PostgreSQL": [], "PgBouncer": [], "Redis": []}
    for process in psutil.process_iter(["name", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if process.info["name"] == "postgres" and str(servers_dir) in command:
            roots["PostgreSQL"].append(process)
        elif process.info["name"] == "pgbouncer" and str(servers_dir) in command:
            roots["PgBouncer"].append(process)
        elif (process.info["name"] or "").startswith("redis-server") and f":{port}" in command:
            roots["Redis"].append(process)
    return roots


def cpu_by_role(roles: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """CPU seconds of each role's process trees; this process's own only (the workers and the
    daemon are its children)."""
    return {
        role: sum(tree_cpu_seconds(root, descendants=root.pid != os.getpid()) for root in roots)
        for role, roots in roles.items()
    }


def sensor_ticks(instance: dg.DagsterInstance, since: float) -> str:
    """The shard sensor's ticks after `since`: started/ended (s after `since`) and runs asked."""
    parts = []
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.name != "shard_workspace_sensor":
            continue
        for tick in reversed(instance.get_ticks(state.instigator_origin_id, state.selector_id)):
            if tick.timestamp < since:
                continue
            ended = tick.end_timestamp or tick.timestamp
            parts.append(
                f"{tick.timestamp - since:.1f}-{ended - since:.1f} ({len(tick.run_ids)} runs)"
            )
    return "; ".join(parts)


def wait_for_first_sensor_tick(instance: dg.DagsterInstance, timeout: float = 180) -> None:
    """Until the shard sensor has been evaluated once (on the empty workspace)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        for state in states:
            if state.name == "shard_workspace_sensor":
                ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
                if ticks and ticks[0].status != TickStatus.STARTED:
                    return
        time.sleep(0.5)
    raise TimeoutError("the shard sensor was never evaluated")


def one_setting(workers: int, names: list[str], args: argparse.Namespace, folder: Path) -> dict:
    """Ingest the corpus with `workers` Celery workers; then the nightly job of every shard."""
    servers_dir, servers = start_servers()
    data = folder / "data"
    incoming = folder / "incoming"  # written beside the workspace, moved in once it is whole
    write_corpus(incoming, names=names, sessions=args.sessions, turns=args.turns)
    settle(incoming)
    (data / "workspace").mkdir(parents=True)
    env = deployment_env(servers, folder / "dagster_home", data, SHARDS)
    yaml_path = folder / "dagster_home" / "dagster.yaml"
    yaml_path.write_text(
        yaml_path.read_text().replace("max_concurrent_runs: 2", f"max_concurrent_runs: {workers}")
    )
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    processes = Processes(env, folder)
    result: dict = {"workers": workers}
    try:
        roles: dict[str, list[psutil.Process]] = {"Celery workers (the runs)": []}
        for number in range(workers):
            worker = processes.celery_worker(f"worker{number + 1}", worker_cores(number, args))
            roles["Celery workers (the runs)"].append(psutil.Process(worker.pid))
        code_server = processes.code_server()
        daemon = processes.daemon()
        roles["daemon + code server (sensors, queue)"] = [
            psutil.Process(daemon.pid),
            psutil.Process(code_server.pid),
        ]
        roles.update(service_roots(servers_dir, env["MEMORY_DAG_REDIS_URL"]))
        roles["this benchmark (polling)"] = [psutil.Process()]
        with dg.DagsterInstance.get() as instance:
            # The deployment is up (daemon, code server, workers) before the files arrive, as
            # in production: its start-up is not part of an ingest.
            wait_for_first_sensor_tick(instance)
            for child in sorted(incoming.iterdir()):
                os.rename(child, data / "workspace" / child.name)
            started, started_at = time.monotonic(), time.time()
            cpu_before = cpu_by_role(roles)
            while True:
                done = instance.get_runs(
                    dg.RunsFilter(job_name="ingest_job", statuses=[dg.DagsterRunStatus.SUCCESS])
                )
                failed = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
                if failed:
                    raise RuntimeError(f"runs failed: {[r.run_id for r in failed]} (logs {folder})")
                if len({r.tags[SHARD_TAG] for r in done}) == SHARDS:
                    break
                time.sleep(1)
            result["ingest_seconds"] = round(time.monotonic() - started, 1)
            cpu_after = cpu_by_role(roles)
            result["ingest_cpu_seconds"] = {
                role: round(cpu_after[role] - cpu_before[role], 1) for role in roles
            }
            result["ingest_run_seconds"] = sorted(
                round(run_seconds(instance, r.run_id), 1) for r in done
            )
            result["ingest_timeline"] = timeline(instance, done, started_at)
            result["ingest_steps"] = where_runs_went(instance, done)
            result["runs_seconds"] = runs_span(instance, done)
            result["sensor_ticks"] = sensor_ticks(instance, started_at)
            settings = Settings.load()
            result["turns"] = episodes(settings)
            result["turns_per_second"] = round(result["turns"] / result["ingest_seconds"], 1)
            if args.verify:
                result["shards_differing"] = shards_differing(settings, folder)

            # Nightly maintenance: one run per shard through the queue, submitted together.
            launches = []
            for shard in range(SHARDS):
                key = shard_key(shard)
                tags = json.dumps({"dagster/partition": key, SHARD_TAG: key})
                command = [str(BIN / "dagster"), "job", "launch", "-w", str(WORKSPACE)]
                command += ["-j", "maintenance_job", "--tags", tags]
                launches.append(subprocess.Popen(command, cwd=REPO, env=env))
            for launch in launches:
                if launch.wait() != 0:
                    raise RuntimeError("dagster job launch failed")
            while True:
                nightly = instance.get_runs(
                    dg.RunsFilter(
                        job_name="maintenance_job", statuses=[dg.DagsterRunStatus.SUCCESS]
                    )
                )
                if len(nightly) == SHARDS:
                    break
                if instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])):
                    raise RuntimeError(f"a maintenance run failed (logs {folder})")
                time.sleep(1)
            records = [instance.get_run_record_by_id(r.run_id) for r in nightly]
            first = min(record.start_time for record in records)
            last = max(record.end_time for record in records)
            result["nightly_all_shards_seconds"] = round(last - first, 1)
            result["nightly_run_seconds"] = sorted(
                round(run_seconds(instance, r.run_id), 1) for r in nightly
            )
            runs = instance.get_runs()
            if args.verify:
                result.update(run_checks(instance, runs))
            events = sum(len(instance.all_logs(run.run_id)) for run in runs)
            result["runs"] = len(runs)
            result["events_per_run"] = round(events / len(runs), 1)
            result.update(sizes(settings, result["turns"]))
    finally:
        processes.stop_all()
        stop_servers(servers_dir)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result["data"] = str(data)
    return result


def service_search_latency(data: Path, names: list[str], queries: int = 200) -> dict:
    """Search through `memory-dag serve` over the 8 shards: each request names a random user
    (and that user's conversation); the service routes it to the user's shard."""
    import httpx

    env = {
        **os.environ,
        "MEMORY_DAG_SHARDS": str(SHARDS),
        "MEMORY_DAG_WORKSPACE": str(data / "workspace"),
        "MEMORY_DAG_DB": str(data / "memory.duckdb"),
    }
    rng = random.Random(0)
    timings = []
    with memory_dag_serve(env) as url, httpx.Client(base_url=url, timeout=60) as client:
        for number in range(queries + 40):
            user = rng.choice(names)
            topic = TOPICS[rng.randrange(len(TOPICS))][0]
            body = {
                "query": f"what about {topic}",
                "user_id": user,
                "conversation_id": f"conv-{user}",
            }
            started = time.perf_counter()
            response = client.post("/v1/memories/search", json=body)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"search failed: {response.status_code} {response.text}")
            if number >= 40:  # the first requests load each shard's index
                timings.append(elapsed)
    timings.sort()
    return {
        "queries": queries,
        "p50_ms": round(statistics.median(timings), 2),
        "p95_ms": round(timings[int(0.95 * len(timings)) - 1], 2),
    }


def search_latency(data: Path, names: list[str], queries: int = 200) -> dict:
    """Routed search: each query goes to the shard of a random user, scoped to that user."""
    os.environ["MEMORY_DAG_SHARDS"] = str(SHARDS)
    base = Settings(workspace=data / "workspace", db_path=data / "memory.duckdb")
    rng = random.Random(0)
    timings = []
    for number in range(queries + 20):
        user = rng.choice(names)
        topic = TOPICS[rng.randrange(len(TOPICS))][0]
        started = time.perf_counter()
        shard = settings_for(base, user_id=user, conversation_id=f"conv-{user}")
        scope = Scope.of(user_id=user, conversation_id=f"conv-{user}")
        search(f"what about {topic}", settings=shard, conversation=f"conv-{user}", scope=scope)
        if number >= 20:  # the first queries load each shard's index
            timings.append((time.perf_counter() - started) * 1000)
    timings.sort()
    return {
        "queries": queries,
        "p50_ms": round(statistics.median(timings), 2),
        "p95_ms": round(timings[int(0.95 * len(timings)) - 1], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users-per-shard", type=int, default=12)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=60, help="turns per session")
    parser.add_argument(
        "--cores-per-worker",
        type=int,
        default=1,
        help="cores each Celery worker is held to (taskset); 0: not pinned",
    )
    parser.add_argument(
        "--workers", default="1,2", help="worker counts to measure, comma-separated (1,2)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare every shard with a single store of its users; count failed runs, lock "
        "errors and overlapping runs of one shard (the scale test's checks, at this size)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    reason = missing_binaries()
    if reason:
        print(f"scale.py: {reason}", file=sys.stderr)
        return 2
    names = users_covering(SHARDS, args.users_per_shard)
    root = Path(tempfile.mkdtemp(prefix="memory-dag-scale-"))
    load = os.getloadavg()
    counts = [int(count) for count in args.workers.split(",")]
    results = [
        one_setting(workers, names, args, root / f"setting-{number}-workers-{workers}")
        for number, workers in enumerate(counts, start=1)
    ]
    latency = search_latency(Path(results[-1]["data"]), names)
    served = service_search_latency(Path(results[-1]["data"]), names)
    by_workers: dict[int, list[dict]] = {}
    for result in results:
        by_workers.setdefault(result["workers"], []).append(result)
    last = results[-1]
    lines = [
        f"benchmarks/scale.py  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  "
        f"load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}  (2 cores)",
        f"corpus: {len(names)} users over {SHARDS} shards, {last['turns']} turns "
        f"({args.sessions} sessions x {args.turns} turns a user); each worker held to "
        + (f"{args.cores_per_worker} core(s) (taskset)" if args.cores_per_worker else "no core"),
        "",
        "| workers | ingest, all 8 shards (s) | turns/s | ingest run per shard (s, min-max) "
        "| nightly, all 8 shards (s) | nightly run per shard (s, min / median / max) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        runs, nights = result["ingest_run_seconds"], result["nightly_run_seconds"]
        lines.append(
            f"| {result['workers']} | {result['ingest_seconds']} | {result['turns_per_second']} "
            f"| {runs[0]}-{runs[-1]} | {result['nightly_all_shards_seconds']} "
            f"| {nights[0]} / {statistics.median(nights):.1f} / {nights[-1]} |"
        )
    lines.append("")
    for result in results:
        lines.append(
            f"ingest runs with {result['workers']} worker(s), shard asked/started/ended (s after "
            f"the corpus arrived): {result['ingest_timeline']}"
        )
        lines.append(
            f"shard sensor ticks with {result['workers']} worker(s), started-ended (s after the "
            f"corpus arrived): {result['sensor_ticks']}"
        )
        lines.append(
            f"ingest step seconds with {result['workers']} worker(s), summed over the "
            f"{SHARDS} runs: {result['ingest_steps']}"
        )
    for result in results:
        spent = result["ingest_cpu_seconds"]
        lines.append(
            f"CPU seconds during the ingest with {result['workers']} worker(s) (of "
            f"{2 * result['ingest_seconds']:.0f} the 2 cores offer in {result['ingest_seconds']}"
            f" s): " + ", ".join(f"{role} {seconds}" for role, seconds in spent.items())
        )
    if 1 in by_workers and 2 in by_workers:

        def median_of(workers: int, key: str) -> float:
            return statistics.median(result[key] for result in by_workers[workers])

        ingest = median_of(1, "ingest_seconds") / median_of(2, "ingest_seconds")
        nightly = median_of(1, "nightly_all_shards_seconds") / median_of(
            2, "nightly_all_shards_seconds"
        )
        runs = median_of(1, "runs_seconds") / median_of(2, "runs_seconds")
        repeats = len(by_workers[1]) + len(by_workers[2])
        lines.append(
            f"speed-up with 2 workers: ingest {ingest:.2f}x, nightly {nightly:.2f}x"
            + (" (medians of the settings above)" if repeats > 2 else "")
        )
        lines.append(
            f"the runs alone (first run asked to last run ended: {median_of(1, 'runs_seconds')} "
            f"s with 1 worker, {median_of(2, 'runs_seconds')} s with 2): {runs:.2f}x; the rest "
            "of the ingest is the sensor's wait for the daemon's next pass and its routing"
        )
    for result in results if args.verify else []:
        lines.append(
            f"checks, {result['workers']} worker(s): shards differing from a single store of "
            f"their users {len(result['shards_differing'])} {result['shards_differing']}, "
            f"failed runs {result['failed_runs']}, lock errors {result['lock_errors']}, "
            f"overlapping runs of one shard {result['same_shard_overlaps']}"
        )
    lines += [
        f"store {last['store_bytes_per_turn']} B a turn, published index "
        f"{last['index_bytes_per_turn']} B a turn (8 shards, every table and index version "
        f"file); {last['events_per_run']} Dagster events a run over {last['runs']} runs",
        f"search through `memory-dag serve` (8 shards, routed by user): p50 {served['p50_ms']} "
        f"ms, p95 {served['p95_ms']} ms over {served['queries']} requests",
        f"routed search (library, 8 shards): p50 {latency['p50_ms']} ms, p95 {latency['p95_ms']} "
        f"ms over {latency['queries']} queries",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
