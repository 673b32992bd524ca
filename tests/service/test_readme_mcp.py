"""The README's MCP client configuration, loaded as a client loads it: each server entry of its
`mcpServers` JSON started or reached with the official SDK's client, with the README's own API
keys file behind the HTTP entry. A README edit that breaks the snippet fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from memory_dag.memory import Memory
from memory_dag.service.app import ServiceConfig, create_app
from tests.service.server import running
from tests.service.test_mcp import TOOLS, _call

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(language: str, containing: str) -> str:
    """The README's fenced `language` block that contains `containing`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"one ```{language} block with {containing!r} in the README"
    return found[0]


def mcp_servers() -> dict[str, dict[str, Any]]:
    return json.loads(readme_block("json", "mcpServers"))["mcpServers"]


def test_the_readme_stdio_entry_starts_memory_dag_mcp_as_written(tmp_path: Path) -> None:
    entry = next(e for e in mcp_servers().values() if "command" in e)
    # A client finds the command on its PATH: here, the environment the tests run in.
    bin_dir = str(Path(sys.executable).parent)
    command = shutil.which(entry["command"], path=bin_dir)
    assert command, f"{entry['command']} is not installed beside {sys.executable}"
    store = tmp_path / "store"
    Memory(path=store).add("Bob keeps bees", user_id="bob", conversation_id="farm")
    env = {  # a client may add "env" to an entry; the README's entry uses the default store
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "MEMORY_DAG_WORKSPACE": str(store / "workspace"),
        "MEMORY_DAG_DB": str(store / "memory.duckdb"),
        "MEMORY_DAG_INDEX_DIR": str(store / "index"),
    }
    params = StdioServerParameters(command=command, args=entry["args"], env=env)
    args = entry["args"]
    user = args[args.index("--user") + 1]

    async def scenario() -> None:
        async with Client(params) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            failed, _ = await _call(
                client, "remember", text=f"{user.title()} grows tomatoes", conversation_id="farm"
            )
            assert not failed
            failed, found = await _call(
                client, "search", query="what grows on the farm", conversation_id="farm"
            )
            assert not failed
            texts = [hit["memory"] for hit in found["results"]]
            assert f"{user.title()} grows tomatoes" in texts and "Bob keeps bees" not in texts

    anyio.run(scenario)


def test_the_readme_http_entry_reaches_mcp_with_the_readme_keys(tmp_path: Path) -> None:
    entry = next(e for e in mcp_servers().values() if "url" in e)
    keys = tmp_path / "keys.yaml"
    keys.write_text(readme_block("yaml", "keys:"), encoding="utf-8")
    bound = yaml.safe_load(keys.read_text(encoding="utf-8"))["keys"]
    key = entry["headers"]["Authorization"].removeprefix("Bearer ")
    assert key in bound, "the MCP snippet's key is one of the README's keys"
    memory = Memory(path=tmp_path / "store")
    memory.add("Bob keeps bees", user_id="bob", conversation_id="farm")
    config = ServiceConfig(api_keys_file=keys, upstream_base_url=None)
    with running(create_app(memory, config)) as url:
        # The README names the default address; the test server has a port of its own.
        assert urlsplit(entry["url"]).path == "/mcp"
        http = create_mcp_http_client(headers=entry["headers"])

        async def scenario() -> None:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
                assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
                failed, _ = await _call(
                    client, "remember", text="Alice grows tomatoes", conversation_id="farm"
                )
                assert not failed
                failed, found = await _call(
                    client, "search", query="what grows on the farm", conversation_id="farm"
                )
                assert not failed
                texts = [hit["memory"] for hit in found["results"]]
                assert "Alice grows tomatoes" in texts and "Bob keeps bees" not in texts

        anyio.run(scenario)
    owner = bound[key]["user"]
    assert [r.memory for r in memory.search("tomatoes", user_id=owner).results][:1] == [
        "Alice grows tomatoes"
    ]
