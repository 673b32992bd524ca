"""The agent's write operations (seed 004 tools): remember, correct, confirm, forget, restore.

Each operation's logic is one function over an open writer (`remember_on`, `correct_on`,
`change_on`): `Memory` and the service run it on the live path's `LiveWriter` (journal +
delta segment, no DuckDB lock), and the functions named after the operations run it on the
store itself in one `MemoryWriter` transaction (maintenance, tests, the truth suite).

* `forget` sets `purge_at` 30 days ahead (seed 003 §7), so a later purge job really removes what
  a user asked to forget; reconciliation deletes and replacements keep no purge date.
* On the store itself, the embed and index stages run after a write (`refresh`), so the next
  search sees the change (republishing takes about a second on LoCoMo-sized stores).
* Every operation takes the caller's `Scope` (`memory_dag/scope.py`): a new memory belongs to
  the scope's user, conversation and run; an existing one may only be changed when the scope
  may read it; a scoped store refuses a caller without a user. `remember` deduplicates
  against the facts of the same owner (the user, else the conversation), never across users.
* `now` is the operation's clock (default: the wall clock); a restore counts as an access at
  that time, so the next night's TTL and decay start from it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.ids import path_part_problem
from memory_dag.index.build import refresh_search_index
from memory_dag.memories.facts import classify_fact, fact_problem
from memory_dag.memories.reconcile import is_near_duplicate, normalise_text
from memory_dag.memories.writer import MemoryOpError, MemoryWriter, NewMemory
from memory_dag.scope import Scope, check_category, known_category, owner_key
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
    #: The conversation of the memory written (for the revision; not part of the answer).
    conversation_id: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("conversation_id")
        return data


@contextmanager
def scoped_writer(
    settings: Settings, actor: str, scope: Scope, now: datetime | None
) -> Iterator[MemoryWriter]:
    """One transaction of a writer on the store, after the scoped-store check (`ScopeRequired`)."""
    with open_store(settings.db_path) as con:
        scope.check_connection(con)
        writer = MemoryWriter(con, get_provider(settings), actor=actor, now=now)
        with writer.transaction():
            yield writer


def _target(writer: Any, memory_id: str, scope: Scope, *, active: bool = True) -> dict[str, Any]:
    """The memory `memory_id` if this scope may change it (AccessDenied, MemoryOpError)."""
    row = writer.active(memory_id) if active else writer.get(memory_id)
    if row is None:
        raise MemoryOpError(f"no memory {memory_id}")
    scope.check_target(row)
    return row


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
    problem = fact_problem(text)
    if problem is not None:
        raise MemoryOpError(
            f"not a valid memory: {problem}; a memory is 1-2 third-person sentences of at most "
            "280 characters with no pronoun left without its referent (seed 003 §9)"
        )
    return " ".join(text.split())


def remember(
    settings: Settings,
    text: str,
    *,
    scope: Scope | None = None,
    speaker: str | None = None,
    category: str | None = None,
    importance: int | None = None,
    tags: Sequence[str] = (),
    actor: str = "agent",
    refresh: bool = True,
    now: datetime | None = None,
) -> WriteResult:
    """Save an explicit fact (seed 004 `remember_fact`) for the scope's user, conversation
    and run (`scope.agent` is recorded as `agent_id`), on the store itself (`remember_on`)."""
    scope = scope or Scope()
    with scoped_writer(settings, actor, scope, now) as writer:
        result = remember_on(
            writer, text, scope=scope, speaker=speaker, category=category,
            importance=importance, tags=tags, now=now,
        )  # fmt: skip
    if result.status == "duplicate":
        return result
    return _finish(settings, result, scope.conversation_id, refresh)


def remember_on(
    writer: Any,
    text: str,
    *,
    scope: Scope,
    speaker: str | None = None,
    category: str | None = None,
    importance: int | None = None,
    tags: Sequence[str] = (),
    now: datetime | None = None,
    attributes: dict[str, Any] | None = None,
) -> WriteResult:
    """`remember` on an open writer (a `MemoryWriter`, or the live path's `LiveWriter`).

    The text is stored as given (after the seed 003 §9 checks); a near-duplicate of an active
    fact of the same owner (same words, or word Jaccard >= 0.75) is not stored again and its
    id is returned with status `duplicate`. Use `correct` to replace a fact. A category must be
    defined in `categories.yaml` (`UnknownCategory` names the known ones) and readable by the
    scope's agent.
    """
    content = _fact_text(text)
    check_category(category)
    conversation_id = scope.conversation_id
    if conversation_id is not None and (problem := path_part_problem(conversation_id)):
        # Conversation ids name folders (export writes entries/<conversation_id>/).
        raise MemoryOpError(f"conversation id {conversation_id!r} {problem}")
    guessed_category, guessed_importance = classify_fact(content)
    chosen = category or known_category(guessed_category)
    owner = owner_key(scope.user_id, scope.conversation_id)
    scope.check_target(
        {"id": "the new memory", "kind": "fact", "category": chosen, "user_id": scope.user_id,
         "conversation_id": scope.conversation_id}
    )  # fmt: skip
    facts = writer.facts(owner)
    key = normalise_text(content)
    for memory_id, existing in zip(facts.ids, facts.texts, strict=True):
        if normalise_text(existing) == key or is_near_duplicate(content, [existing]):
            return WriteResult("duplicate", memory_id)
    memory = NewMemory(
        content=content,
        conversation_id=scope.conversation_id,
        session_id=scope.run_id,
        speaker=speaker,
        source_role="agent",
        category=chosen,
        importance=importance if importance is not None else guessed_importance,
        event_time=now or _now(),
        user_id=scope.user_id,
        agent_id=scope.agent,
        tags=list(tags),
        attributes=attributes,
    )
    return WriteResult("created", writer.add(memory, meta={"op": "remember"}))


def correct(
    settings: Settings, memory_id: str, text: str, **options: Unpack[Options]
) -> WriteResult:
    """Replace a memory with a corrected text (seed 004 `correct_fact`), on the store itself
    (`correct_on`)."""
    scope = options.get("scope") or Scope()
    with scoped_writer(settings, options.get("actor", "agent"), scope, options.get("now")) as w:
        result = correct_on(w, memory_id, text, scope=scope, actor=options.get("actor", "agent"))
    return _finish(settings, result, result.conversation_id, options.get("refresh", True))


def correct_on(
    writer: Any, memory_id: str, text: str, *, scope: Scope, actor: str = "agent"
) -> WriteResult:
    """`correct` on an open writer: the old memory is soft-deleted with `replaced_by`, the new
    one `supersedes` it and keeps its scope, sources, tags and decay rate."""
    content = _fact_text(text)
    old = _target(writer, memory_id, scope)
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
    result.conversation_id = old["conversation_id"]
    return result


class Options(TypedDict, total=False):
    """What every operation also takes: the caller's `scope` (default: an unscoped caller),
    the `actor` named in `history` ("agent"), `refresh` (publish the search index before
    returning, default True) and `now` (the operation's clock, default the wall clock)."""

    scope: Scope | None
    actor: str
    refresh: bool
    now: datetime | None


def confirm(settings: Settings, memory_id: str, **options: Unpack[Options]) -> WriteResult:
    """Protect a memory: it no longer decays (decay_rate 0) and is fully trusted (confidence 1).
    Decay and confidence are not part of the search index: nothing is republished."""
    return _change(settings, memory_id, "confirmed", {**options, "refresh": False})


def forget(settings: Settings, memory_id: str, **options: Unpack[Options]) -> WriteResult:
    """Soft-delete a memory; it is purged `FORGET_PURGE_DAYS` later unless restored."""
    return _change(settings, memory_id, "forgotten", options)


def restore(settings: Settings, memory_id: str, **options: Unpack[Options]) -> WriteResult:
    """Bring back a soft-deleted memory (forgotten, contradicted or expired); it counts as an
    access at `now`."""
    return _change(settings, memory_id, "restored", options)


def _change(settings: Settings, memory_id: str, status: str, options: Options) -> WriteResult:
    """One memory confirmed, forgotten or restored, in one writer transaction."""
    scope = options.get("scope") or Scope()
    with scoped_writer(settings, options.get("actor", "agent"), scope, options.get("now")) as w:
        result = change_on(w, memory_id, status, scope=scope)
    return _finish(settings, result, result.conversation_id, options.get("refresh", True))


def change_on(writer: Any, memory_id: str, status: str, *, scope: Scope) -> WriteResult:
    """Confirm, forget or restore (`status` confirmed | forgotten | restored) on an open writer."""
    if memory_id.startswith("ep_") and status == "forgotten":
        raise MemoryOpError("episodes mirror transcript files: edit the transcript instead")
    row = _target(writer, memory_id, scope, active=status != "restored")
    if status == "forgotten":
        if row["kind"] == "episode":
            raise MemoryOpError("episodes mirror transcript files: edit the transcript instead")
        writer.soft_delete(
            memory_id,
            change="soft_deleted",
            purge_after_days=FORGET_PURGE_DAYS,
            meta={"op": "forget"},
        )
    elif status == "restored":
        writer.restore(memory_id, meta={"op": "restore"})
    else:
        writer.confirm(memory_id, meta={"op": "confirm"})
    result = WriteResult(status, memory_id)
    result.conversation_id = row["conversation_id"]
    return result
