"""MCP tools (the official `mcp` SDK): `memory_query`, `search`, `remember`, `forget`.

Served over streamable HTTP at `/mcp` by `memory-dag serve` (the caller's API key in the
`Authorization` header, checked by the app before the request reaches MCP), and over stdio by
`memory-dag mcp` (the identity given on its command line). Each tool calls `Memory`, for the
caller's agent and user, exactly as the REST API does.

A client's configuration (Claude Desktop and others):

    {"mcpServers": {"memory": {"command": "memory-dag", "args": ["mcp", "--agent", "supervisor",
                                                                  "--user", "alice"]}}}
    {"mcpServers": {"memory": {"url": "http://127.0.0.1:8765/mcp",
                               "headers": {"Authorization": "Bearer <key>"}}}}
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver.context import Context
from mcp.server.mcpserver.exceptions import ToolError

from memory_dag.service.identity import Identity, ServiceConfigError

INSTRUCTIONS = (
    "Long-term memory of the user. `memory_query` and `search` read what you may read; "
    "`remember` stores a fact (one or two third-person sentences); `forget` removes one by id."
)


def build_mcp(service: Any, identity: Identity | None = None) -> MCPServer:
    """The MCP server over a `Service` (its memory and keys). `identity` is the caller when
    there is no HTTP request to carry a key (stdio)."""
    mcp = MCPServer("memory-dag", instructions=INSTRUCTIONS)

    def caller(ctx: Context, user_id: str | None) -> dict[str, Any]:
        who = identity
        headers = _headers(ctx)
        if headers is not None:
            who = service.identify(headers)
            if who is None:  # the app refuses these before MCP; a key may have gone meanwhile
                raise ServiceConfigError("a valid API key is needed")
        who = who or Identity()
        return {"user_id": who.user(user_id), "agent_id": who.agent}

    @mcp.tool()
    def memory_query(
        query: str,
        ctx: Context,
        categories: list[str] | None = None,
        filters: dict[str, Any] | None = None,
        user_id: str | None = None,
        conversation_id: str | None = None,
        limit: int = 5,
        max_tokens: int | None = None,
        min_score: float | None = None,
        mode: Literal["bullets", "full"] = "bullets",
    ) -> dict[str, Any]:
        """memory.query: what your agent may read about the query, as bullets within
        `max_tokens` tokens (categories outside your allowlist are refused)."""
        with _said_clearly():
            who = caller(ctx, user_id)
            if who["agent_id"] is None:
                raise ValueError("memory_query needs an agent identity (an API key bound to one)")
            return service.memory.query(
                query,
                agent_id=who["agent_id"],
                user_id=who["user_id"],
                categories=categories,
                filters=filters,
                conversation_id=conversation_id,
                limit=limit,
                max_tokens=max_tokens,
                min_score=min_score,
                return_=mode,
            ).to_dict()

    @mcp.tool()
    def search(
        query: str,
        ctx: Context,
        user_id: str | None = None,
        conversation_id: str | None = None,
        run_id: str | None = None,
        filters: dict[str, Any] | None = None,
        limit: int | None = None,
        min_score: float | None = None,
    ) -> dict[str, Any]:
        """The memories most relevant to the query, with their ids."""
        with _said_clearly():
            return service.memory.search(
                query,
                **caller(ctx, user_id),
                conversation_id=conversation_id,
                run_id=run_id,
                filters=filters,
                limit=limit,
                min_score=min_score,
            ).to_dict()

    @mcp.tool()
    def remember(
        text: str,
        ctx: Context,
        user_id: str | None = None,
        conversation_id: str | None = None,
        category: str | None = None,
        importance: int | None = None,
    ) -> dict[str, Any]:
        """Store a fact: one or two third-person sentences (searchable at once)."""
        with _said_clearly():
            return service.memory.add(
                text,
                **caller(ctx, user_id),
                conversation_id=conversation_id,
                category=category,
                importance=importance,
            ).to_dict()

    @mcp.tool()
    def forget(
        memory_id: str,
        ctx: Context,
        user_id: str | None = None,
        conversation_id: str | None = None,
    ) -> dict[str, Any]:
        """Forget a memory by id (gone from every read at once; restorable for 30 days)."""
        with _said_clearly():
            return service.memory.delete(
                memory_id, **caller(ctx, user_id), conversation_id=conversation_id
            ).to_dict()

    return mcp


@contextmanager
def _said_clearly() -> Iterator[None]:
    """A refusal or a bad argument as a tool error that says what is wrong (the REST API's
    error kinds, `app.ERRORS`), not the SDK's generic "error executing tool"."""
    from memory_dag.service.app import ERRORS

    try:
        yield
    except tuple(exception for exception, _, _ in ERRORS) as error:
        kind = next(kind for exception, _, kind in ERRORS if isinstance(error, exception))
        raise ToolError(f"{kind}: {error}") from error


def _headers(ctx: Context) -> dict[str, str] | None:
    """The HTTP request's headers, lower-cased (None over stdio)."""
    try:
        headers = ctx.headers
    except ValueError:
        return None
    if headers is None:
        return None
    return {str(k).lower(): str(v) for k, v in headers.items()}


def run_stdio(service: Any, identity: Identity) -> None:
    """Serve the tools over stdin/stdout for `identity` (`memory-dag mcp`)."""
    import anyio

    anyio.run(build_mcp(service, identity).run_stdio_async)
