"""The service under test: a real uvicorn server on loopback over a fresh store, with API keys
(two users' supervisors, a planner bound to no user, a stylist for alice) and the scripted
OpenAI-compatible server as its upstream."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from memory_dag.memory import Memory
from memory_dag.service.app import ServiceConfig, create_app
from tests.openai_server import ScriptedOpenAIServer
from tests.service.server import running

ALICE = "key-alice-supervisor"
BOB = "key-bob-supervisor"
PLANNER = "key-planner-any-user"
STYLIST = "key-alice-stylist"
KEYS = {
    ALICE: {"agent": "supervisor", "user": "alice"},
    BOB: {"agent": "supervisor", "user": "bob"},
    PLANNER: {"agent": "planner"},
    STYLIST: {"agent": "stylist", "user": "alice"},
}


@dataclass
class Served:
    url: str
    memory: Memory
    upstream: ScriptedOpenAIServer
    root: Path

    def client(self, key: str | None, **headers: str) -> httpx.Client:
        """An HTTP client calling with `key` (None: no key)."""
        sent = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers={**sent, **headers}, timeout=60)


def write_keys(folder: Path) -> Path:
    path = folder / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": KEYS}), encoding="utf-8")
    return path


@pytest.fixture
def served(tmp_path: Path, openai_server: ScriptedOpenAIServer) -> Iterator[Served]:
    """The service with keys, over `tmp_path/store`, proxying to the scripted server."""
    memory = Memory(path=tmp_path / "store")
    config = ServiceConfig(
        api_keys_file=write_keys(tmp_path),
        upstream_base_url=openai_server.base_url,
        upstream_timeout=2.0,
        max_body_bytes=64 * 1024,
    )
    with running(create_app(memory, config)) as url:
        yield Served(url, memory, openai_server, tmp_path / "store")


def ok(response: httpx.Response, status: int = 200) -> Any:
    """The JSON of a response that must have `status`."""
    assert response.status_code == status, response.text
    return response.json()
