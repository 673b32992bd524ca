"""What `Memory` returns: pydantic models, each with `to_dict()` and `to_json()`.

The same shapes are the REST API's bodies (`memory_dag/service/rest.py`) and the MCP tools'
results, so the Python API, the service and the command line's `--json` agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from memory_dag.read.results import Candidate


class Result(BaseModel):
    """A result that turns into plain JSON."""

    model_config = ConfigDict(populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def to_json(self, *, indent: int | None = None) -> str:
        return self.model_dump_json(by_alias=True, indent=indent)


class MemoryItem(Result):
    """One memory: a fact (or summary, reflection, ...) or a transcript turn.

    `memory` is its text (mem0's name); `run_id` is the session it was said or written in.
    """

    id: str
    memory: str
    kind: str
    state: str = "active"
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    conversation_id: str | None = None
    category: str | None = None
    importance: int | None = None
    speaker: str | None = None
    role: str | None = None
    event_time: datetime | None = None
    created_at: datetime | None = None
    source_ids: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None
    #: Search results only: the ranking score (relevance, recency, relations), and whether a
    #: newer statement superseded what this turn said.
    score: float | None = None
    superseded: bool = False
    #: Where a transcript turn or note is (file and lines).
    path: str | None = None
    start_line: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MemoryItem:
        """A memory row (of the store, the index's catalog or the delta segment)."""
        attributes = row.get("attributes")
        if isinstance(attributes, str):
            attributes = json.loads(attributes)
        metadata = attributes.get("metadata") if isinstance(attributes, dict) else None
        return cls(
            id=row["id"],
            memory=row["content"],
            kind=row["kind"],
            state=row.get("state") or "active",
            user_id=row.get("user_id"),
            agent_id=row.get("agent_id"),
            run_id=row.get("session_id"),
            conversation_id=row.get("conversation_id"),
            category=row.get("category"),
            importance=row.get("importance"),
            speaker=row.get("speaker"),
            role=row.get("source_role"),
            event_time=row.get("event_time"),
            created_at=row.get("created_at"),
            source_ids=list(row.get("source_ids") or []),
            metadata=metadata,
            path=row.get("path"),
        )

    @classmethod
    def from_candidate(cls, candidate: Candidate) -> MemoryItem:
        """A search result: a memory, or a transcript turn (by its episode id)."""
        hit = candidate.hit
        ids = candidate.memory_ids
        single_turn = hit.kind == "transcript" and len(ids) == 1
        return cls(
            id=ids[0] if len(ids) == 1 else hit.id,
            memory=candidate.text,
            kind="episode" if single_turn else hit.kind,
            user_id=hit.user_id,
            agent_id=hit.agent_id,
            run_id=hit.session_id,
            conversation_id=hit.conversation_id,
            category=hit.category,
            importance=hit.importance,
            speaker=hit.speaker,
            role=hit.role,
            event_time=hit.event_time,
            score=round(candidate.score, 6),
            superseded=candidate.superseded,
            path=hit.path or None,
            start_line=hit.start_line if hit.path else None,
        )


class MemoryList(Result):
    results: list[MemoryItem]


class SearchResults(Result):
    """`Memory.search`: the memories ranked for a query, within the caller's scope."""

    query: str
    results: list[MemoryItem]
    #: The read path's stages that ran (`read/retriever.py`).
    stages: list[str] = Field(default_factory=list)


Event = Literal["ADD", "UPDATE", "DELETE", "NONE", "RESTORE", "CONFIRM"]


class MemoryEvent(Result):
    """What a write did to one memory (mem0's events, plus RESTORE and CONFIRM)."""

    id: str
    memory: str
    event: Event
    #: UPDATE: the memory this one replaced.
    previous_id: str | None = None


class AddResult(Result):
    """`Memory.add`: the memories written (facts extracted from user turns, or the text given)
    and the transcript turns recorded, with the session they went to."""

    results: list[MemoryEvent] = Field(default_factory=list)
    #: Episode ids of the transcript turns recorded (messages only).
    turns: list[str] = Field(default_factory=list)
    conversation_id: str | None = None
    run_id: str | None = None
    #: The session this write closed by starting a new one (its consolidation is queued).
    closed_run_id: str | None = None


class ChangeResult(Result):
    """`update`, `delete`, `restore`, `confirm`: `status` is updated | forgotten | restored |
    confirmed; `id` the memory that holds the information now."""

    status: str
    id: str
    replaced_id: str | None = None


class HistoryEvent(Result):
    at: datetime
    event: str
    memory_id: str | None = None
    old_ref: str | None = None
    new_ref: str | None = None
    actor: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    #: A live write the pipeline has not folded into the store yet.
    pending: bool = False


class HistoryResult(Result):
    memory: MemoryItem
    events: list[HistoryEvent]


class ContextResult(Result):
    """`Memory.context`: the block to inject before an agent's turn (`read/context_block.py`)."""

    text: str
    tokens: int
    max_tokens: int
    #: The conversation's revision: pass it as `since_rev` next time.
    rev: int | None
    sections: dict[str, int] = Field(default_factory=dict)
    stages: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
