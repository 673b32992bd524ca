"""Killing `memory-dag ingest` processes at chosen steps, for tests/cli/test_dead_runs.py and
`benchmarks/hostile.py`: start one on a Dagster home, see which steps its runs started, and
check that what a kill left behind is still readable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEventType
from dagster._core.storage.dagster_run import RunsFilter

from memory_dag.cli.dagster_runs import PID_TAG
from memory_dag.config import ENV_PREFIX, Settings
from memory_dag.dagster_event_log import open_instance as open_instance  # the CLI's instance
from memory_dag.index.published import current_version, load_index
from memory_dag.store.connection import open_store, schema_version

REPO_ROOT = Path(__file__).resolve().parents[1]


def dagster_home(folder: Path) -> Path:
    """A Dagster home with the project's instance settings (one `duckdb` slot)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "data" / "dagster_home" / "dagster.yaml", folder / "dagster.yaml")
    return folder


def cli_env(home: Path | None = None) -> dict[str, str]:
    """The caller's environment without MEMORY_DAG_* settings, on `home` if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    if home is not None:
        env["DAGSTER_HOME"] = str(home)
    return env


def cli() -> list[str]:
    """How to run the installed `memory-dag` command."""
    script = Path(sys.executable).with_name("memory-dag")
    return [str(script)] if script.exists() else [sys.executable, "-m", "memory_dag.cli.main"]


def ingest_command(settings: Settings, *extra: str) -> list[str]:
    return [
        *cli(),
        "ingest",
        "--workspace",
        str(settings.workspace),
        "--db",
        str(settings.db_path),
        *extra,
    ]


def start_ingest(settings: Settings, home: Path, *extra: str, **popen: Any) -> subprocess.Popen:
    """A `memory-dag ingest` process on `home` (output discarded unless `popen` says)."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.Popen(ingest_command(settings, *extra), env=cli_env(home), **popen)


def started_steps(instance: dg.DagsterInstance, pid: int) -> dict[str, float]:
    """Step key → when it first started, over the runs of process `pid`."""
    steps: dict[str, float] = {}
    for record in instance.get_run_records(filters=RunsFilter(tags={PID_TAG: str(pid)})):
        events = instance.get_records_for_run(
            record.dagster_run.run_id, of_type=DagsterEventType.STEP_START
        ).records
        for event in events:
            entry = event.event_log_entry
            steps.setdefault(entry.step_key, entry.timestamp)
    return steps


def check_readable(settings: Settings) -> None:
    """The last good state: the store opens (empty if killed before its first commit), and
    CURRENT, if any, names a whole index. Raises otherwise."""
    if settings.db_path.exists():
        with open_store(settings.db_path, read_only=True) as con:
            if schema_version(con) > 0:
                con.execute("SELECT count(*) FROM files").fetchone()
    if current_version(settings.index_dir) is not None:
        load_index(settings.index_dir)
