"""Hostile input, kill -9 and SQL escapes, on the paths a user takes (issue 14).

    python benchmarks/hostile.py [--examples 100] [--kill-delays 0,0.4] [--out FILE]
        [--store PATH]

1. Hostile inputs: hypothesis draws workspaces in which good lines sit beside hostile lines and
   files (tests/hostile_inputs.py); each is ingested twice with every stage (`run_all`).
   Prints hostile inputs tried / ingest failures / good lines lost / bad lines or files
   without an `ingest_errors` row.
2. Kill points: real `memory-dag ingest` processes on one Dagster instance with the project's
   dagster.yaml (one `duckdb` slot), on a copy of the sample workspace. Each process is
   SIGKILLed when its run starts a given step (+ each delay of --kill-delays), so each must
   first get past whatever its killed predecessor held; after every kill the store must open
   and CURRENT must name a whole index. A process that does not reach its kill point within
   300 s hangs. A last ingest must finish within 300 s and converge to a clean run's tables.
   Prints kill points tried / states unreadable / later runs that hang.
3. SQL escapes: `memory-dag sql` as a process, for every escape of `sql_escapes`; one
   succeeded if it exited 0, showed the secret, changed the store or CURRENT, or made a file.
   Prints escapes tried / succeeded, then how long a writer waits while a long `sql` read runs,
   and (--store PATH) how long the snapshot of a given store holds its lock.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from memory_dag.config import Settings  # noqa: E402
from memory_dag.index.published import current_version  # noqa: E402
from memory_dag.store.connection import open_store  # noqa: E402
from tests import kill_points as kill  # noqa: E402
from tests.hostile_inputs import check_ingest, hostile_workspace, sql_escapes  # noqa: E402

#: Steps of `memory-dag ingest` in the order they start (the re-index after the summaries
#: starts `chunk_embeddings` and `indexes` again, in a later run).
STEPS = [
    "workspace_files",
    "chunks",
    "facts",
    "chunks_chunks_are_valid",
    "entities",
    "chunk_embeddings",
    "chunk_embeddings_every_chunk_embedded",
    "indexes",
    "search_index_index_matches_embeddings",
    "conversation_summaries",
]
BOUND = 300.0
TABLES = ["files", "episodes", "notes", "chunks", "facts", "summaries", "ingest_errors"]


# --- 1. hostile inputs ---------------------------------------------------------------------------


def hostile_inputs(examples: int, scratch: Path) -> dict[str, int]:
    totals = {"workspaces": 0, "tried": 0, "failures": 0, "lost": 0, "unreported": 0}
    problems: list[str] = []

    @seed(14)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(files=hostile_workspace())
    def run(files: list) -> None:
        outcome = check_ingest(Path(tempfile.mkdtemp(dir=scratch)), files)
        totals["workspaces"] += 1
        totals["tried"] += outcome.inputs
        totals["failures"] += outcome.failures
        totals["lost"] += outcome.good_lost
        totals["unreported"] += outcome.bad_unreported
        problems.extend(outcome.problems)

    run()
    for problem in problems[:10]:
        print("  problem:", problem.strip().splitlines()[-1])
    return totals


# --- 2. kill points ------------------------------------------------------------------------------


def readable(settings: Settings) -> bool:
    try:
        kill.check_readable(settings)
    except Exception as error:
        print(f"  unreadable: {type(error).__name__}: {error}")
        return False
    return True


def table_counts(settings: Settings) -> dict[str, int]:
    with open_store(settings.db_path, read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def run_ingest(settings: Settings, home: Path) -> None:
    """A whole `memory-dag ingest`; raises on failure or after `BOUND` seconds."""
    subprocess.run(
        kill.ingest_command(settings, "--json"),
        env=kill.cli_env(home),
        check=True,
        timeout=BOUND,
        capture_output=True,
    )


def kill_points(delays: list[float], scratch: Path) -> dict[str, int]:
    workspace = scratch / "workspace"
    shutil.copytree(ROOT / "data" / "workspace", workspace)

    # A clean run, to compare the end state with.
    clean = Settings(workspace=workspace, db_path=scratch / "clean" / "memory.duckdb")
    run_ingest(clean, kill.dagster_home(scratch / "clean_home"))
    expected = table_counts(clean)

    settings = Settings(workspace=workspace, db_path=scratch / "killed" / "memory.duckdb")
    home = kill.dagster_home(scratch / "killed_home")
    instance = kill.open_instance(home)
    totals = {"tried": 0, "unreadable": 0, "hangs": 0, "missed": 0}
    points = [(step, delay) for delay in delays for step in STEPS]
    try:
        for step, delay in points:
            process = kill.start_ingest(settings, home, "--force", "--json")
            started = time.monotonic()
            killed = False
            while time.monotonic() - started < BOUND and process.poll() is None:
                steps = kill.started_steps(instance, process.pid)
                at = steps.get(step)
                if at is not None and time.time() >= at + delay:
                    process.send_signal(signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.02)
            if not killed and process.poll() is None:
                totals["hangs"] += 1
                print(f"  hang: never reached {step} in {BOUND:.0f}s")
                process.kill()
            elif not killed:
                totals["missed"] += 1  # it finished before the point: not a kill point
            process.wait()
            if killed:
                totals["tried"] += 1
                totals["unreadable"] += not readable(settings)
            outcome = "killed" if killed else "finished first"
            print(f"  {step} +{delay:.1f}s: {outcome} after {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        try:
            run_ingest(settings, home)
            converged = table_counts(settings) == expected
            print(f"  last ingest: {time.monotonic() - started:.1f}s, converged: {converged}")
            totals["not_converged"] = int(not converged)
        except subprocess.TimeoutExpired:
            totals["hangs"] += 1
            print("  last ingest hung")
        totals["unreadable"] += not readable(settings)
    finally:
        instance.dispose()
    return totals


# --- 3. SQL escapes ------------------------------------------------------------------------------


def sql_escape_attempts(scratch: Path) -> dict[str, int]:
    workspace = scratch / "workspace"
    shutil.copytree(ROOT / "data" / "workspace", workspace)
    settings = Settings(workspace=workspace, db_path=scratch / "store" / "memory.duckdb")
    subprocess.run(
        kill.ingest_command(settings, "--no-dagster", "--json"),
        env=kill.cli_env(),
        check=True,
        capture_output=True,
        timeout=BOUND,
    )
    probe = scratch / "probe"
    probe.mkdir()
    queries = sql_escapes(settings, probe)
    version = current_version(settings.index_dir)
    store = settings.db_path.read_bytes()
    files = sorted(p.name for p in probe.iterdir())
    totals = {"tried": 0, "succeeded": 0}
    for query in queries:
        done = subprocess.run(
            [*kill.cli(), "sql", query, "--db", str(settings.db_path)],
            env=kill.cli_env(),
            capture_output=True,
            text=True,
            timeout=BOUND,
        )
        totals["tried"] += 1
        escaped = (
            done.returncode == 0
            or "the secret" in done.stdout + done.stderr
            or current_version(settings.index_dir) != version
            or settings.db_path.read_bytes() != store
            or sorted(p.name for p in probe.iterdir()) != files
        )
        totals["succeeded"] += escaped
        if escaped:
            print(f"  escaped: {query}")
    totals["writer_wait"] = writer_wait_during_long_read(settings, scratch)
    return totals


def writer_wait_during_long_read(settings: Settings, scratch: Path) -> float:
    """Seconds a writer waits for the store while a long `memory-dag sql` read runs (it takes
    the lock only to copy the store); the read is stopped afterwards."""
    snapshots = scratch / "tmp"
    snapshots.mkdir()
    reader = subprocess.Popen(
        [*kill.cli(), "sql", "SELECT sum(i % 7) FROM range(100000000000) t(i)", "--db"]
        + [str(settings.db_path)],
        env={**kill.cli_env(), "TMPDIR": str(snapshots)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not any(snapshots.glob("memory-dag-sql-*/memory.duckdb")):  # copying
            assert reader.poll() is None, "the read ended early"
            time.sleep(0.01)
        began = time.monotonic()
        with open_store(settings.db_path, lock_timeout=BOUND) as con:
            con.execute("SELECT 1")
        waited = time.monotonic() - began
        assert reader.poll() is None, "the long read ended early"
    finally:
        reader.kill()
        reader.wait()
    return waited


def snapshot_lock_seconds(db_path: Path, repeats: int = 5) -> float:
    """Median seconds `memory-dag sql` holds a store's lock to copy it."""
    from memory_dag.store.user_sql import snapshot_copy

    times = []
    for _ in range(repeats):
        began = time.monotonic()
        with snapshot_copy(db_path):
            times.append(time.monotonic() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="hostile workspaces")
    parser.add_argument("--kill-delays", default="0,0.4", help="seconds after a step starts")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--store", type=Path, default=None, help="also time the SQL snapshot of this store"
    )
    args = parser.parse_args()

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"memory-dag hostile input / kill -9 / SQL escapes  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    say(
        f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{os.cpu_count()} cpus"
    )
    with tempfile.TemporaryDirectory(prefix="memory-dag-hostile-") as folder:
        scratch = Path(folder)
        began = time.monotonic()
        (scratch / "inputs").mkdir()
        inputs = hostile_inputs(args.examples, scratch / "inputs")
        say(
            f"\nhostile inputs: {inputs['tried']} tried in {inputs['workspaces']} workspaces "
            f"({time.monotonic() - began:.0f}s) / ingest failures {inputs['failures']} / "
            f"good lines lost {inputs['lost']} / bad lines without an error row "
            f"{inputs['unreported']}"
        )
        began = time.monotonic()
        delays = [float(d) for d in args.kill_delays.split(",") if d.strip()]
        kills = kill_points(delays, scratch / "kills")
        say(
            f"kill points: {kills['tried']} tried ({time.monotonic() - began:.0f}s; "
            f"{kills['missed']} finished before their point) / states unreadable "
            f"{kills['unreadable']} / later runs that hang {kills['hangs']} / "
            f"end state differs from a clean run {kills.get('not_converged', 1)}"
        )
        escapes = sql_escape_attempts(scratch / "sql")
        say(f"SQL escapes: {escapes['tried']} tried / succeeded {escapes['succeeded']}")
        say(
            f"a writer waited {escapes['writer_wait']:.2f}s for the store while a long "
            "`memory-dag sql` read ran"
        )
        if args.store:
            size = args.store.stat().st_size / 1e6
            seconds = snapshot_lock_seconds(args.store)
            say(f"SQL snapshot of a {size:,.0f} MB store: lock held {seconds:.2f}s (median of 5)")
    say(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
