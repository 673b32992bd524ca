"""The REST API (`/v1/...`): `Memory`'s methods over HTTP, for the caller's identity.

The agent is always the API key's; the user is the key's when it has one (a request naming
another is 403), else the one the request names. Bodies and answers are `Memory`'s models
(`memory_results.py`), so the names are the Python API's and the command line's: `limit`,
`min_score`, `max_tokens`, `user_id`, `run_id`, `conversation_id`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import iterate_in_threadpool

from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.writer import MemoryOpError
from memory_dag.memory_results import (
    AddResult,
    ChangeResult,
    ContextResult,
    HistoryResult,
    MemoryItem,
    MemoryList,
    SearchResults,
)
from memory_dag.read.query import MemoryQueryResponse
from memory_dag.scope import ScopeRequired
from memory_dag.service.app import identity_of, service_of

router = APIRouter(prefix="/v1")


class Body(BaseModel):
    """A request body: unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class AddRequest(Body):
    """A memory (`text`) or conversation turns (`messages`) to learn from."""

    text: str | None = Field(None, description="a memory: 1-2 third-person sentences")
    messages: list[dict[str, Any]] | None = Field(None, description="OpenAI-style turns")
    user_id: str | None = None
    run_id: str | None = None
    conversation_id: str | None = None
    metadata: dict[str, Any] | None = None
    infer: bool = True
    category: str | None = None
    importance: int | None = Field(None, ge=1, le=5)

    @model_validator(mode="after")
    def _one_of(self) -> AddRequest:
        if (self.text is None) == (self.messages is None):
            raise ValueError("give exactly one of `text` and `messages`")
        return self


class UpdateRequest(Body):
    text: str
    user_id: str | None = None
    conversation_id: str | None = None


class SearchRequest(Body):
    query: str = Field(min_length=1)
    user_id: str | None = None
    run_id: str | None = None
    conversation_id: str | None = None
    filters: dict[str, Any] | None = None
    limit: int | None = Field(None, ge=1, le=100)
    min_score: float | None = Field(None, ge=0.0, le=1.0)


class QueryRequest(Body):
    """memory.query (seed 003 §6) for the key's agent."""

    query: str = Field(min_length=1)
    categories: list[str] | None = None
    filters: dict[str, Any] | None = None
    user_id: str | None = None
    conversation_id: str | None = None
    limit: int = Field(5, ge=1, le=100)
    max_tokens: int | None = Field(None, ge=1)
    min_score: float | None = Field(None, ge=0.0, le=1.0)
    return_: Literal["bullets", "full"] = Field("bullets", alias="return")


class ContextRequest(Body):
    query: str = Field(min_length=1, description="the message the agent is about to answer")
    conversation_id: str = Field(min_length=1)
    user_id: str | None = None
    run_id: str | None = None
    exclude_run_id: str | None = Field(None, description="the current session, left out")
    limit: int | None = Field(None, ge=1, le=50)
    max_tokens: int | None = Field(None, ge=1, le=32_000)
    min_score: float | None = Field(None, ge=0.0, le=1.0)
    since_rev: int | None = Field(None, ge=0)


def _caller(request: Request, user_id: str | None) -> dict[str, Any]:
    """`Memory`'s identity parameters for a request: the key's agent, the key's user."""
    identity = identity_of(request)
    return {"user_id": identity.user(user_id), "agent_id": identity.agent}


@router.post("/memories", status_code=201, response_model=AddResult, tags=["memories"])
def add_memory(body: AddRequest, request: Request) -> AddResult:
    """Remember a text, or record turns and learn their facts (durable and searchable on
    return)."""
    return service_of(request).memory.add(
        body.text if body.text is not None else body.messages,  # type: ignore[arg-type]
        **_caller(request, body.user_id),
        run_id=body.run_id,
        conversation_id=body.conversation_id,
        metadata=body.metadata,
        infer=body.infer,
        category=body.category,
        importance=body.importance,
    )


@router.get("/memories", response_model=MemoryList, tags=["memories"])
def list_memories(
    request: Request,
    user_id: str | None = None,
    run_id: str | None = None,
    conversation_id: str | None = None,
    limit: int = 100,
) -> MemoryList:
    """The caller's active memories (for a user, run, conversation), newest first."""
    return service_of(request).memory.get_all(
        **_caller(request, user_id),
        run_id=run_id,
        conversation_id=conversation_id,
        limit=max(1, min(limit, 1000)),
    )


@router.post("/memories/search", response_model=SearchResults, tags=["memories"])
def search_memories(body: SearchRequest, request: Request) -> SearchResults:
    """The memories most relevant to a query, within the caller's scope."""
    return service_of(request).memory.search(
        body.query,
        **_caller(request, body.user_id),
        run_id=body.run_id,
        conversation_id=body.conversation_id,
        filters=body.filters,
        limit=body.limit,
        min_score=body.min_score,
    )


@router.get("/memories/{memory_id}", response_model=MemoryItem, tags=["memories"])
def get_memory(
    memory_id: str, request: Request, user_id: str | None = None, conversation_id: str | None = None
) -> MemoryItem:
    """One memory (404 when there is none the caller may read)."""
    try:
        item = service_of(request).memory.get(
            memory_id, **_caller(request, user_id), conversation_id=conversation_id
        )
    except ScopeRequired:
        raise
    except AccessDenied as error:  # out of scope: as if it did not exist
        raise MemoryOpError(f"no memory {memory_id}") from error
    if item is None:
        raise MemoryOpError(f"no memory {memory_id}")
    return item


@router.put("/memories/{memory_id}", response_model=ChangeResult, tags=["memories"])
def update_memory(memory_id: str, body: UpdateRequest, request: Request) -> ChangeResult:
    """Replace a memory with a corrected text (a new memory, with a new id)."""
    return service_of(request).memory.update(
        memory_id,
        body.text,
        **_caller(request, body.user_id),
        conversation_id=body.conversation_id,
    )


@router.delete("/memories/{memory_id}", response_model=ChangeResult, tags=["memories"])
def delete_memory(
    memory_id: str, request: Request, user_id: str | None = None, conversation_id: str | None = None
) -> ChangeResult:
    """Forget a memory (gone from every read at once; restorable for 30 days)."""
    return service_of(request).memory.delete(
        memory_id, **_caller(request, user_id), conversation_id=conversation_id
    )


@router.post("/memories/{memory_id}/restore", response_model=ChangeResult, tags=["memories"])
def restore_memory(
    memory_id: str, request: Request, user_id: str | None = None, conversation_id: str | None = None
) -> ChangeResult:
    """Bring back a forgotten memory."""
    return service_of(request).memory.restore(
        memory_id, **_caller(request, user_id), conversation_id=conversation_id
    )


@router.get("/memories/{memory_id}/history", response_model=HistoryResult, tags=["memories"])
def memory_history(
    memory_id: str, request: Request, user_id: str | None = None, conversation_id: str | None = None
) -> HistoryResult:
    """A memory's audit trail (seed 003 §8), live writes not folded yet included."""
    return service_of(request).memory.history(
        memory_id, **_caller(request, user_id), conversation_id=conversation_id
    )


@router.post("/query", response_model=MemoryQueryResponse, tags=["read"])
def memory_query(body: QueryRequest, request: Request) -> MemoryQueryResponse:
    """memory.query for the key's agent: its allowlist, within `max_tokens`."""
    caller = _caller(request, body.user_id)
    if caller["agent_id"] is None:
        raise ValueError("memory.query needs an agent: use an API key bound to one")
    return service_of(request).memory.query(
        body.query,
        agent_id=caller["agent_id"],
        user_id=caller["user_id"],
        categories=body.categories,
        filters=body.filters,
        conversation_id=body.conversation_id,
        limit=body.limit,
        max_tokens=body.max_tokens,
        min_score=body.min_score,
        return_=body.return_,
    )


@router.post("/context", response_model=ContextResult, tags=["read"])
def memory_context(body: ContextRequest, request: Request) -> ContextResult:
    """The block to inject before the agent's turn (delta header, summary, memories)."""
    return service_of(request).memory.context(
        body.query,
        **_caller(request, body.user_id),
        conversation_id=body.conversation_id,
        run_id=body.run_id,
        exclude_run_id=body.exclude_run_id,
        limit=body.limit,
        max_tokens=body.max_tokens,
        min_score=body.min_score,
        since_rev=body.since_rev,
    )


@router.get("/users/{user_id}/export", tags=["memories"])
def export_user(user_id: str, request: Request) -> StreamingResponse:
    """JSON lines of a user's memories and their history (seed 003 §8)."""
    caller = _caller(request, user_id)
    if caller["user_id"] != user_id:
        raise AccessDenied(f"the caller may not export user {user_id!r}")
    lines = service_of(request).memory.export(user_id=user_id, agent_id=caller["agent_id"])
    first = next(lines, None)  # errors (scope, a busy store) before the 200 is sent

    def rest() -> Iterator[str]:
        if first is not None:
            yield json.dumps(first, default=str, ensure_ascii=False) + "\n"
        for line in lines:
            yield json.dumps(line, default=str, ensure_ascii=False) + "\n"

    return StreamingResponse(iterate_in_threadpool(rest()), media_type="application/x-ndjson")
