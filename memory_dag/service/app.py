"""`memory-dag serve`: one ASGI app (FastAPI) with the proxy, the REST API and MCP.

    POST /v1/chat/completions   OpenAI-compatible proxy: memory in, facts out (`proxy.py`)
    GET  /v1/models             passed through to the upstream
    /v1/memories, /v1/query, /v1/context, /v1/users/{user_id}/export   REST (`rest.py`)
    /mcp                        MCP over streamable HTTP (`mcp.py`); `memory-dag mcp`: stdio
    /docs, /openapi.json        the API's documentation

Every route calls `Memory` (the CLI's functions); the caller's identity (agent, user) comes
from its API key (`identity.py`). Bad requests get a 4xx JSON error `{"error": {"type",
"message"}}`; a body over `max_body_bytes` is refused (413) before anything is written.
Run it with `memory-dag serve`, or under any ASGI server (`memory_dag.service.asgi:app`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from memory_dag.index.published import IndexNotBuiltError
from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.transcripts import DEFAULT_IDLE_SECONDS
from memory_dag.memories.writer import MemoryOpError
from memory_dag.memory import Memory
from memory_dag.scope import ScopeRequired, UnknownCategory
from memory_dag.service.identity import (
    ApiKeys,
    Identity,
    ServiceConfigError,
    check_bind,
    is_loopback,
    token_of,
)
from memory_dag.service.learner import Learner
from memory_dag.store.connection import StoreLockedError
from memory_dag.store.shards import RouteRequired

#: Paths that need a key when keys are configured (the docs stay readable).
PROTECTED_PREFIXES = ("/v1", "/mcp")
DEFAULT_PORT = 8765


class ServiceConfig(BaseModel):
    """How the service runs; `from_env` reads `MEMORY_DAG_*` (README "Configuration")."""

    upstream_base_url: str | None = Field(None, description="OpenAI-compatible server proxied")
    upstream_api_key: str | None = Field(None, exclude=True, repr=False)
    upstream_timeout: float = 120.0
    api_keys_file: Path | None = None
    #: Largest request body accepted (bytes).
    max_body_bytes: int = 4 * 1024 * 1024
    #: A proxied conversation starts a new session after this long without a turn.
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    #: The identity of callers when no keys are configured (open, loopback only).
    open_agent: str | None = None
    open_user: str | None = None
    #: The address served (MCP's DNS-rebinding guard admits loopback hosts on loopback).
    host: str = "127.0.0.1"

    @classmethod
    def from_env(cls, **overrides: Any) -> ServiceConfig:
        env = {
            "upstream_base_url": os.environ.get("MEMORY_DAG_UPSTREAM_BASE_URL"),
            "upstream_api_key": os.environ.get("MEMORY_DAG_UPSTREAM_API_KEY"),
            "upstream_timeout": os.environ.get("MEMORY_DAG_UPSTREAM_TIMEOUT"),
            "api_keys_file": os.environ.get("MEMORY_DAG_API_KEYS"),
            "max_body_bytes": os.environ.get("MEMORY_DAG_MAX_BODY_BYTES"),
            "idle_seconds": os.environ.get("MEMORY_DAG_SESSION_IDLE_SECONDS"),
        }
        values = {k: v for k, v in env.items() if v}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    def keys(self) -> ApiKeys | None:
        return ApiKeys.load(self.api_keys_file) if self.api_keys_file else None


class Service:
    """What the routes share: the memory, the keys, the upstream client, the configuration."""

    def __init__(self, memory: Memory, config: ServiceConfig, keys: ApiKeys | None) -> None:
        self.memory = memory
        self.config = config
        self.keys = keys
        self.upstream: httpx.AsyncClient | None = None
        #: Learns the proxy's turns after their answers, off the requests' cycles.
        self.learner = Learner()

    def identify(self, headers: Any) -> Identity | None:
        """The caller of a request; None when keys are configured and it has no valid one."""
        token, via_authorization = token_of(headers)
        if self.keys is None:
            return Identity(self.config.open_agent, self.config.open_user)
        identity = self.keys.identify(token)
        if identity is None:
            return None
        return Identity(identity.agent, identity.user_id, via_authorization)


def service_of(request: Request) -> Service:
    return request.app.state.service


def identity_of(request: Request) -> Identity:
    return request.state.identity


def error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    """The service's error body."""
    return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status)


# --------------------------------------------------------------------------- middleware


class BodyLimit:
    """Refuse a request body over `limit` bytes (413) before the route reads it: by its
    Content-Length, and by counting when it is streamed without one."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge(self.limit)
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:  # raised where no route turned it into its answer
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: dict, receive: Callable, send: Callable) -> None:
        await error(413, "request_too_large", _too_large(self.limit))(scope, receive, send)


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


class _TooLarge(HTTPException):
    """A streamed body went over the limit (FastAPI passes an HTTPException through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large(limit))


class KeyCheck:
    """Identify the caller of every request; 401 on a protected path without a valid key."""

    def __init__(self, app: Any, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        identity = self.service.identify(headers)
        if identity is None and scope["path"].startswith(PROTECTED_PREFIXES):
            response = error(
                401,
                "unauthorized",
                "a valid API key is needed: `Authorization: Bearer <key>` or `X-Memory-Api-Key`",
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["identity"] = identity or Identity()
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------- errors

#: Exceptions of the library and the HTTP answer each gets.
ERRORS: list[tuple[type[Exception], int, str]] = [
    (ScopeRequired, 400, "scope_required"),
    (RouteRequired, 400, "scope_required"),  # a sharded store: no user, no shard to ask
    (AccessDenied, 403, "access_denied"),
    (UnknownCategory, 400, "unknown_category"),
    (IndexNotBuiltError, 404, "nothing_to_search"),
    (StoreLockedError, 503, "store_busy"),
    (MemoryOpError, 400, "invalid_operation"),
    (ValueError, 400, "invalid_request"),
]


def _install_errors(app: FastAPI) -> None:
    def handler(status: int, kind: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def handle(_: Request, exc: Exception) -> JSONResponse:
            message = str(exc)
            if isinstance(exc, MemoryOpError) and message.startswith("no memory"):
                return error(404, "not_found", message)
            return error(status, kind, message)

        return handle

    for exception, status, kind in ERRORS:
        app.add_exception_handler(exception, handler(status, kind))

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        details = exc.errors() if isinstance(exc, RequestValidationError) else []
        where = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in details
        )
        return error(422, "invalid_request", where or str(exc), details=_plain(details))

    app.add_exception_handler(RequestValidationError, invalid)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return error(exc.status_code, kinds.get(exc.status_code, "http_error"), str(exc.detail))

    app.add_exception_handler(HTTPException, http_error)


def _plain(details: list[Any]) -> list[Any]:
    return [{k: v for k, v in d.items() if k in ("loc", "msg", "type")} for d in details]


# --------------------------------------------------------------------------- the app


def create_app(memory: Memory | None = None, config: ServiceConfig | None = None) -> FastAPI:
    """The service over `memory` (default: `Memory()`), configured by `config` (default: the
    environment). ServiceConfigError when the key file is wrong."""
    from memory_dag.service.mcp import build_mcp
    from memory_dag.service.proxy import router as proxy_router
    from memory_dag.service.rest import router as rest_router

    config = config or ServiceConfig.from_env()
    service = Service(memory or Memory(), config, config.keys())
    mcp = build_mcp(service)
    mcp_app = mcp.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True, host=config.host
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        timeout = httpx.Timeout(config.upstream_timeout, connect=10.0)
        async with httpx.AsyncClient(timeout=timeout) as client, mcp.session_manager.run():
            service.upstream = client
            yield
            service.upstream = None
        await run_in_threadpool(service.learner.close)  # the turns answered are learned

    app = FastAPI(
        title="memory-dag",
        summary="Long-term memory for LLM agents: an OpenAI-compatible proxy, REST and MCP.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = service
    _install_errors(app)
    app.include_router(proxy_router)
    app.include_router(rest_router)
    app.router.routes.extend(mcp_app.routes)  # POST/GET/DELETE /mcp (streamable HTTP)

    @app.get("/health", tags=["service"])
    def health() -> dict[str, Any]:
        return {"status": "ok", "keys": service.keys is not None}

    app.add_middleware(KeyCheck, service=service)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    return app


def serve(
    memory: Memory,
    config: ServiceConfig,
    *,
    port: int = DEFAULT_PORT,
    sock: socket.socket | None = None,
    log_level: str = "info",
) -> None:
    """Run the service with uvicorn until stopped (refuses a public address without keys)."""
    import uvicorn

    keys = config.keys()
    check_bind(config.host, keys)
    if keys is None:
        who = f"agent {config.open_agent or '(any: operator)'}, user {config.open_user or 'any'}"
        print(
            f"memory-dag serve: no API keys: open to local callers only ({config.host}), as {who}",
            file=sys.stderr,
        )
    else:
        print(
            f"memory-dag serve: {len(keys)} API key(s) from {config.api_keys_file}", file=sys.stderr
        )
    if not config.upstream_base_url:
        print(
            "memory-dag serve: no MEMORY_DAG_UPSTREAM_BASE_URL: the proxy answers 503",
            file=sys.stderr,
        )
    app = create_app(memory, config)
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=port, log_level=log_level, lifespan="on")
    )
    server.run(sockets=[sock] if sock is not None else None)


__all__ = ["ServiceConfig", "ServiceConfigError", "create_app", "is_loopback", "serve"]
