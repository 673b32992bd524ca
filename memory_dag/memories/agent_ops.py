"""The agent's write operations (seed 004 tools; the CLI commands call these): remember,
correct, confirm, forget, restore. Each is one writer transaction.

* `forget` sets `purge_at` 30 days ahead (seed 003 §7), so a later purge job really removes what
  a user asked to forget; reconciliation deletes and replacements keep no purge date.
* After a write the embed and index stages run before returning, so the next search sees the
  change (republishing the index takes about a second on LoCoMo-sized stores).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.ids import path_part_problem
from memory_dag.index.build import refresh_search_index
from memory_dag.memories.facts import classify_fact, validate_fact
from memory_dag.memories.reconcile import is_near_duplicate, normalise_text
from memory_dag.memories.writer import MemoryOpError, MemoryWriter, NewMemory
from memory_dag.store.connection import open_store

#: Seed 003 §7: a forgotten memory is purged this many days later (unless restored).
FORGET_PURGE_DAYS = 30


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class WriteResult:
    """What an operation did: `status` is created | duplicate | updated | confirmed |
    forgotten | restored; `memory_id` is the memory now holding the information."""

    status: str
    memory_id: str
    replaced_id: str | None = None
    revision: int | None = None
    index_rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def _writer(settings: Settings, actor: str) -> Iterator[MemoryWriter]:
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=actor)
        with writer.transaction():
            yield writer


def _revision(settings: Settings, conversation_id: str | None) -> int:
    with open_store(settings.db_path, read_only=True) as con:
        row = con.execute(
            "SELECT rev FROM conversation_revisions WHERE conversation_id = ?",
            [conversation_id or ""],
        ).fetchone()
    return int(row[0]) if row else 0


def refresh_index(settings: Settings) -> int:
    """Embed what is missing and publish the search index: a write is searchable on return."""
    return int(refresh_search_index(settings)[-1].counts.get("rows", 0))


def _finish(
    settings: Settings, result: WriteResult, conversation_id: str | None, refresh: bool
) -> WriteResult:
    result.revision = _revision(settings, conversation_id)
    if refresh:
        result.index_rows = refresh_index(settings)
    return result


def _fact_text(text: str) -> str:
    cleaned = validate_fact(text)
    if cleaned is None:
        raise MemoryOpError(
            "a memory is 1-2 sentences of at most 280 characters, and not empty (seed 003 §9)"
        )
    return cleaned


def remember(
    settings: Settings,
    text: str,
    *,
    conversation_id: str | None = None,
    session_id: str | None = None,
    speaker: str | None = None,
    category: str | None = None,
    importance: int | None = None,
    user_id: str | None = None,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    actor: str = "agent",
    refresh: bool = True,
) -> WriteResult:
    """Save an explicit fact (seed 004 `remember_fact`).

    The text is stored as given (after the seed 003 §9 checks); a near-duplicate of an active
    fact of the conversation (same words, or word Jaccard >= 0.75) is not stored again and its
    id is returned with status `duplicate`. Use `correct` to replace a fact.
    """
    content = _fact_text(text)
    if conversation_id is not None and (problem := path_part_problem(conversation_id)):
        # Conversation ids name folders (export writes entries/<conversation_id>/).
        raise MemoryOpError(f"conversation id {conversation_id!r} {problem}")
    guessed_category, guessed_importance = classify_fact(content)
    with _writer(settings, actor) as writer:
        facts = writer.facts(conversation_id)
        key = normalise_text(content)
        for memory_id, existing in zip(facts.ids, facts.texts, strict=True):
            if normalise_text(existing) == key or is_near_duplicate(content, [existing]):
                return WriteResult("duplicate", memory_id)
        memory = NewMemory(
            content=content,
            conversation_id=conversation_id,
            session_id=session_id,
            speaker=speaker,
            source_role="agent",
            category=category or guessed_category,
            importance=importance if importance is not None else guessed_importance,
            event_time=_now(),
            user_id=user_id,
            agent_id=agent_id,
            tags=list(tags),
        )
        memory_id = writer.add(memory, meta={"op": "remember"})
    return _finish(settings, WriteResult("created", memory_id), conversation_id, refresh)


def correct(
    settings: Settings, memory_id: str, text: str, *, actor: str = "agent", refresh: bool = True
) -> WriteResult:
    """Replace a memory with a corrected text (seed 004 `correct_fact`): the old one is
    soft-deleted with `replaced_by`, the new one `supersedes` it and keeps its scope and sources."""
    content = _fact_text(text)
    with _writer(settings, actor) as writer:
        old = writer.active(memory_id)
        if old["kind"] == "episode":
            raise MemoryOpError("episodes mirror transcript files: edit the transcript instead")
        if normalise_text(old["content"]) == normalise_text(content):
            raise MemoryOpError(f"memory {memory_id} already says that")
        category, importance = classify_fact(content)
        memory = NewMemory(
            content=content,
            kind=old["kind"],
            conversation_id=old["conversation_id"],
            session_id=old["session_id"],
            speaker=old["speaker"],
            source_role=actor,
            category=old["category"] or category,
            importance=old["importance"] if old["importance"] is not None else importance,
            event_time=old["event_time"],
            source_ids=list(old["source_ids"] or []),
            user_id=old["user_id"],
            agent_id=old["agent_id"],
            tags=list(old["tags"] or []),
            decay_rate=old["decay_rate"],
        )
        new_id = writer.replace(memory_id, memory, meta={"op": "correct"})
    result = WriteResult("updated", new_id, replaced_id=memory_id)
    return _finish(settings, result, old["conversation_id"], refresh)


def confirm(settings: Settings, memory_id: str, *, actor: str = "agent") -> WriteResult:
    """Protect a memory: it no longer decays (decay_rate 0) and is fully trusted (confidence 1)."""
    with _writer(settings, actor) as writer:
        writer.confirm(memory_id, meta={"op": "confirm"})
        conversation = writer.get(memory_id)["conversation_id"]
    # Decay and confidence are not part of the search index: nothing to republish.
    return _finish(settings, WriteResult("confirmed", memory_id), conversation, refresh=False)


def forget(
    settings: Settings, memory_id: str, *, actor: str = "agent", refresh: bool = True
) -> WriteResult:
    """Soft-delete a memory; it is purged `FORGET_PURGE_DAYS` later unless restored."""
    with _writer(settings, actor) as writer:
        row = writer.active(memory_id)
        if row["kind"] == "episode":
            raise MemoryOpError("episodes mirror transcript files: edit the transcript instead")
        writer.soft_delete(
            memory_id,
            change="soft_deleted",
            purge_after_days=FORGET_PURGE_DAYS,
            meta={"op": "forget"},
        )
    return _finish(settings, WriteResult("forgotten", memory_id), row["conversation_id"], refresh)


def restore(
    settings: Settings, memory_id: str, *, actor: str = "agent", refresh: bool = True
) -> WriteResult:
    """Bring back a soft-deleted memory (forgotten, contradicted or expired)."""
    with _writer(settings, actor) as writer:
        writer.restore(memory_id, meta={"op": "restore"})
        conversation = writer.get(memory_id)["conversation_id"]
    return _finish(settings, WriteResult("restored", memory_id), conversation, refresh)
