"""`memory-dag serve` in its own process, as a user starts it, for the benchmarks that time it
(`service.py`: the proxy; `scale.py`: search over shards)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def memory_dag_serve(env: dict[str, str], *args: str, timeout: float = 120.0) -> Iterator[str]:
    """`memory-dag serve [args]` on a free loopback port with `env`; yields its URL once
    `/health` answers, and stops the server when the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "memory_dag.cli.main", "serve", "--port", str(port), *args],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("memory-dag serve did not start")
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)
