"""MCP with the official SDK's client: the tools over streamable HTTP at /mcp (identity from the
API key) and over stdio (`memory-dag mcp`), and their isolation."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from memory_dag.memory import Memory
from tests.service.conftest import ALICE, BOB, STYLIST, Served

TOOLS = {"memory_query", "search", "remember", "forget"}


def _http(served: Served, key: str | None) -> Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(f"{served.url}/mcp", http_client=http))


async def _call(client: Client, tool: str, **arguments: Any) -> tuple[bool, Any]:
    """(whether the tool failed, its JSON answer or error text)."""
    result = await client.call_tool(tool, arguments)
    text = "".join(part.text for part in result.content if hasattr(part, "text"))
    failed = bool(getattr(result, "is_error", False) or getattr(result, "isError", False))
    return failed, (text if failed else json.loads(text))


def test_the_tools_over_http_act_for_the_keys_identity(served: Served) -> None:
    async def scenario() -> None:
        async with _http(served, ALICE) as alice, _http(served, BOB) as bob:
            listed = await alice.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS
            failed, added = await _call(
                alice, "remember", text="Alice's locker code is 2468", category="profile",
                conversation_id="gym",
            )  # fmt: skip
            assert not failed and added["results"][0]["event"] == "ADD"
            secret = added["results"][0]["id"]
            failed, found = await _call(alice, "search", query="locker code", conversation_id="gym")
            assert [r["id"] for r in found["results"]][:1] == [secret]
            failed, bullets = await _call(
                alice, "memory_query", query="locker code", conversation_id="gym", min_score=0
            )
            assert not failed and "2468" in json.dumps(bullets)

            # Bob's key: never her memory, never acting for her, never forgetting it.
            failed, found = await _call(
                bob, "search", query="locker code 2468", conversation_id="gym", min_score=0
            )
            assert not failed and secret not in json.dumps(found)
            failed, _ = await _call(bob, "search", query="locker", user_id="alice")
            assert failed
            failed, _ = await _call(bob, "forget", memory_id=secret)
            assert failed
            failed, bullets = await _call(
                bob, "memory_query", query="locker code", conversation_id="gym", min_score=0
            )
            assert "2468" not in json.dumps(bullets)

            failed, gone = await _call(alice, "forget", memory_id=secret)
            assert not failed and gone["status"] == "forgotten"
            failed, found = await _call(alice, "search", query="locker code", conversation_id="gym")
            assert secret not in json.dumps(found)

    anyio.run(scenario)


def test_an_agent_reads_only_its_allowlist_over_mcp(served: Served) -> None:
    served.memory.add("Alice lives in Lisbon", user_id="alice", conversation_id="c",
                      category="profile")  # fmt: skip
    served.memory.add("Alice likes a dry tone", user_id="alice", conversation_id="c",
                      category="tone")  # fmt: skip

    async def scenario() -> None:
        async with _http(served, STYLIST) as stylist:
            failed, found = await _call(
                stylist, "search", query="Alice", conversation_id="c", min_score=0
            )
            assert not failed and "Lisbon" not in json.dumps(found)
            assert "dry tone" in json.dumps(found)
            for categories in (["profile"], ["Profile"], ["tone", "PROFILE"]):
                failed, text = await _call(
                    stylist, "memory_query", query="Alice", categories=categories
                )
                assert failed and "access_denied" in text, categories
            failed, text = await _call(
                stylist,
                "search",
                query="Alice",
                conversation_id="c",
                filters={"category": "profile"},
            )
            assert failed
            failed, _ = await _call(stylist, "remember", text="Alice is 40", category="profile")
            assert failed

    anyio.run(scenario)


def test_mcp_over_http_needs_a_key(served: Served) -> None:
    async def scenario() -> None:
        async with _http(served, None) as anonymous:
            await anonymous.list_tools()

    with pytest.raises(Exception):  # noqa: B017 - the SDK wraps the HTTP 401 its own way
        anyio.run(scenario)
    assert served.client(None).post("/mcp", json={}).status_code == 401


def test_memory_dag_mcp_over_stdio(tmp_path: Path) -> None:
    store = tmp_path / "store"
    memory = Memory(path=store)
    memory.add("Bob keeps bees", user_id="bob", conversation_id="farm", category="activity")
    folders = ["--workspace", str(store / "workspace"), "--db", str(store / "memory.duckdb"),
               "--index-dir", str(store / "index")]  # fmt: skip
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memory_dag.cli.main", "mcp", "--agent", "supervisor", "--user", "alice",
              *folders],
        cwd=str(Path(__file__).resolve().parents[2]),
    )  # fmt: skip

    async def scenario() -> None:
        async with Client(params) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            failed, added = await _call(
                client, "remember", text="Alice grows tomatoes", category="activity",
                conversation_id="farm",
            )  # fmt: skip
            assert not failed
            failed, found = await _call(
                client, "search", query="what grows or lives on the farm", conversation_id="farm",
                min_score=0,
            )  # fmt: skip
            assert not failed
            texts = [r["memory"] for r in found["results"]]
            assert "Alice grows tomatoes" in texts and "Bob keeps bees" not in texts
            failed, _ = await _call(client, "search", query="bees", user_id="bob")
            assert failed

    anyio.run(scenario)
    # What the stdio server wrote is live for every process.
    found = memory.search("tomatoes", user_id="alice", conversation_id="farm")
    assert [r.memory for r in found.results][:1] == ["Alice grows tomatoes"]
