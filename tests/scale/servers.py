"""Real servers for the scale tests, on loopback: PostgreSQL and Redis started by
`deploy/local/start.sh` (Debian's binaries), the Dagster daemon and Celery workers as
subprocesses. Every test that needs them skips with the reason when the binaries are absent."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "deploy" / "local"
#: The deployment's workspace: the standing code server that `Processes.code_server` starts.
WORKSPACE = LOCAL / "workspace.yaml"
BIN = Path(sys.executable).parent


def missing_binaries() -> str | None:
    """Why the servers cannot start here, or None."""
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        return "PostgreSQL binaries absent (apt-get install postgresql; .ci/run installs them)"
    if shutil.which("redis-server") is None:
        return "redis-server absent (apt-get install redis-server; .ci/run installs it)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_servers() -> tuple[Path, dict[str, str]]:
    """PostgreSQL + Redis on free loopback ports (deploy/local/start.sh): their folder and the
    environment that names them (the folder's `env` file)."""
    # Not under pytest's 0700 temp folders: as root, PostgreSQL runs as the postgres user.
    folder = Path(tempfile.mkdtemp(prefix="memory-dag-servers-"))
    folder.chmod(0o755)
    names = ("PGPORT", "BOUNCER_PORT", "REDIS_PORT", "CODE_SERVER_PORT")
    ports: dict[str, str] = {}
    while len(set(ports.values())) < len(names):  # all different
        ports = {name: str(free_port()) for name in names}
    started = subprocess.run(
        [LOCAL / "start.sh", folder], env={**os.environ, **ports}, capture_output=True, text=True
    )
    if started.returncode != 0:
        stop_servers(folder, keep_logs=True)  # what did start; the message names its logs
        raise RuntimeError(f"deploy/local/start.sh failed: {started.stderr.strip()}")
    values = {}
    for line in (folder / "env").read_text().split("export ")[1:]:
        for pair in line.split():
            key, _, value = pair.partition("=")
            values[key] = value
    return folder, values


def stop_servers(folder: Path, *, keep_logs: bool = False) -> None:
    subprocess.run([LOCAL / "stop.sh", folder], capture_output=True)
    if not keep_logs:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """PostgreSQL + Redis for this module; yields the environment that names them."""
    reason = missing_binaries()
    if reason:
        pytest.skip(reason)
    folder, values = start_servers()
    try:
        yield values
    finally:
        stop_servers(folder)


class Processes:
    """Subprocesses started by a test, each stopped (by its own pid) at the end."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[subprocess.Popen] = []
        self.named: dict[str, subprocess.Popen] = {}

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append(process)
        self.named[name] = process
        return process

    def celery_worker(self, name: str, cores: set[int] | None = None) -> subprocess.Popen:
        """One Celery worker with one process: it runs one Dagster run (one shard) at a time.

        `cores` holds it (and the runs it starts) to those cores, as a worker machine or a pod's
        CPU limit would: every pool inside a run sizes itself by them.
        """
        pin = ["taskset", "-c", ",".join(map(str, sorted(cores)))] if cores else []
        return self.start(
            name,
            pin
            + [
                str(BIN / "celery"),
                "-A",
                "dagster_celery.app",
                "worker",
                "--concurrency=1",
                "--prefetch-multiplier=1",
                "-Q",
                "dagster",
                "-n",
                f"{name}@%h",
                "--loglevel=INFO",
            ],
        )

    def code_server(self, timeout: float = 120) -> subprocess.Popen:
        """The code location's gRPC server (deploy/local/workspace.yaml names it), once it
        answers."""
        from dagster._grpc.client import DagsterGrpcClient

        port = self.env["MEMORY_DAG_CODE_SERVER_PORT"]
        server = self.start(
            "code_server",
            [str(BIN / "dagster"), "api", "grpc", "-h", "127.0.0.1", "-p", port]
            + ["-m", "memory_dag.definitions", "-d", str(REPO)],
        )
        client = DagsterGrpcClient(port=int(port), host="127.0.0.1")
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping("memory-dag")
                return server
            except Exception:
                if server.poll() is not None or time.monotonic() > deadline:
                    log = self.logs / "code_server.log"
                    raise RuntimeError(f"the code server did not start (see {log})") from None
                time.sleep(0.25)

    def daemon(self) -> subprocess.Popen:
        """The Dagster daemon, over the code server (started first when it is not running)."""
        server = self.named.get("code_server")
        if server is None or server.poll() is not None:
            self.code_server()
        return self.start("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(WORKSPACE)])

    def stop_all(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.started:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: no psutil in the test dependencies)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def deployment_env(servers: dict[str, str], home: Path, data: Path, shards: int) -> dict[str, str]:
    """The environment of the daemon, the workers and the test's own instance."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(LOCAL / "dagster.yaml", home / "dagster.yaml")
    return {
        **os.environ,
        **servers,
        "DAGSTER_HOME": str(home),
        "MEMORY_DAG_SHARDS": str(shards),
        "MEMORY_DAG_WORKSPACE": str(data / "workspace"),
        "MEMORY_DAG_DB": str(data / "memory.duckdb"),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(LOCAL)]),
    }
