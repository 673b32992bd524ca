"""The change log read back (seed 003 §1): what changed after a revision, and the delta
header an agent is shown ("Memory updates since rev X: ...").

Both are read through a `Scope` (`memory_dag/scope.py`): a change is listed only when the
scope may read its memory (user, agent's categories, procedural memories only when asked
for), and a change whose memory is gone (purged) only for an unrestricted scope.

The header shows the net state since the revision: a memory is never shown as created,
updated, restored, confirmed or merged unless it is active now (a fact replaced by a
correction reads only through its replacement), and a replacement of a memory that was
itself new since the revision reads as created.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from memory_dag.config import Settings
from memory_dag.index.published import IndexNotBuiltError
from memory_dag.index.search import get_searcher
from memory_dag.memories.journal import JOURNAL_SEQ_KEY
from memory_dag.scope import Scope
from memory_dag.store.connection import fetch_dicts, get_meta, open_store

#: Seed 003 §1: the delta header shows at most this many bullets.
MAX_DELTA_BULLETS = 3
_CHANGE_SYMBOL = {
    "created": "+",
    "updated": "↑",
    "merged": "↔",
    "deleted": "×",
    "soft_deleted": "−",
    "restored": "↺",
    "confirmed": "✓",
}
#: Events that say a memory is there (as opposed to gone).
_PRESENT_EVENTS = ("created", "updated", "merged", "restored", "confirmed")


@dataclass
class Delta:
    """Changes after revision `since` (seed 003 §1) and the header an agent is shown."""

    since: int
    revisions: dict[str, int]
    changes: list[dict[str, Any]]
    header: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StoredChanges:
    """What the store says about changes after a revision: its folded journal position, the
    change rows (unfiltered) and each conversation's revision. Read once per store version by
    the context block (`read/context_block.py`); `changes` reads it afresh."""

    folded: int
    rows: tuple[dict[str, Any], ...]
    revisions: tuple[tuple[str, int], ...]


def changes(
    settings: Settings,
    since: int,
    conversation_id: str | None = None,
    *,
    scope: Scope | None = None,
) -> Delta:
    """What changed after revision `since` that `scope` may read, oldest first, with the header.

    Revisions count per conversation. With `conversation_id` None (and none in the scope)
    every conversation is read, each against its own revision. The header holds at most 3
    bullets: the net change of each memory, newest first; it is empty when nothing changed.
    A scoped store (memories of several users) needs a scope with a user (`ScopeRequired`).
    """
    scope = scope or Scope()
    conversation_id = conversation_id if conversation_id is not None else scope.conversation_id
    with open_store(settings.db_path, read_only=True) as con:
        scope.check_connection(con)
        stored = stored_changes(con, since, conversation_id)
    return delta_of(settings, since, stored, conversation_id=conversation_id, scope=scope)


def stored_changes(con: Any, since: int, conversation_id: str | None) -> StoredChanges:
    """The store's part of `changes` (on an open connection)."""
    where = "c.rev > ?"
    params: list[Any] = [since]
    if conversation_id is not None:
        where += " AND c.conversation_id = ?"
        params.append(conversation_id)
    folded = int(get_meta(con, JOURNAL_SEQ_KEY) or 0)
    rows = fetch_dicts(
        con,
        "SELECT c.conversation_id, c.rev, c.event, c.memory_id, c.ts, c.meta, m.kind, "
        "m.category, m.importance, m.content, m.user_id, m.session_id, m.attributes, "
        "m.state AS memory_state, m.conversation_id AS memory_conversation FROM change_log c "
        f"LEFT JOIN memories m ON m.id = c.memory_id WHERE {where} "
        "ORDER BY c.conversation_id, c.rev",
        params,
    )
    for row in rows:
        row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
    revision_rows = con.execute(
        "SELECT conversation_id, rev FROM conversation_revisions"
        + (" WHERE conversation_id = ?" if conversation_id is not None else ""),
        [conversation_id] if conversation_id is not None else [],
    ).fetchall()
    revisions = tuple((conversation, int(rev)) for conversation, rev in revision_rows)
    return StoredChanges(folded, tuple(rows), revisions)


def delta_of(
    settings: Settings,
    since: int,
    stored: StoredChanges,
    *,
    conversation_id: str | None,
    scope: Scope,
) -> Delta:
    """`changes` from the store's part (rows after `since` of it are used) and the live
    writes not folded yet, read through `scope` (whose store check the caller made)."""
    revisions = dict(stored.revisions)
    if conversation_id is not None:
        revisions.setdefault(conversation_id, 0)
    rows = [dict(row) for row in stored.rows if row["rev"] > since]
    live = live_changes(settings, stored.folded, revisions, conversation_id)
    rows += [row for row in live if row["rev"] > since]
    rows = [row for row in rows if _readable(scope, row)]
    for row in rows:
        for key in ("user_id", "session_id", "attributes", "memory_conversation"):
            row.pop(key)
    return Delta(since, revisions, rows, delta_header(since, rows))


def live_changes(
    settings: Settings,
    folded: int,
    revisions: dict[str, int],
    conversation_id: str | None = None,
) -> list[dict[str, Any]]:
    """Changes of live writes the store has not folded yet (the delta segment's), numbered as
    the revisions they will get when folded; `revisions` (the store's) is raised to match.

    The numbers are a forecast: the pipeline may log changes of its own first.
    """
    try:
        overlay = get_searcher(settings).overlay()
    except IndexNotBuiltError:
        return []
    rows: list[dict[str, Any]] = []
    for change in overlay.changes:
        memory = change.memory
        conversation = memory.get("conversation_id") or ""
        if change.seq <= folded or conversation_id not in (None, conversation):
            continue
        revisions[conversation] = revisions.get(conversation, 0) + 1
        now = overlay.memories.get(memory["id"], memory)
        rows.append(
            {
                "conversation_id": conversation,
                "rev": revisions[conversation],
                "event": change.event,
                "memory_id": memory["id"],
                "ts": change.at,
                "meta": {"replaces": change.by, "live": True} if change.by else {"live": True},
                "kind": memory.get("kind"),
                "category": memory.get("category"),
                "importance": memory.get("importance"),
                "content": memory.get("content"),
                "user_id": memory.get("user_id"),
                "session_id": memory.get("session_id"),
                "attributes": memory.get("attributes"),
                "memory_state": now.get("state", "active"),
                "memory_conversation": memory.get("conversation_id"),
            }
        )
    return rows


def current_revision(settings: Settings, con: Any, conversation_id: str) -> int:
    """A conversation's revision: the store's, plus its live writes not folded yet."""
    row = con.execute(
        "SELECT rev FROM conversation_revisions WHERE conversation_id = ?", [conversation_id]
    ).fetchone()
    revisions = {conversation_id: int(row[0]) if row else 0}
    live_changes(settings, int(get_meta(con, JOURNAL_SEQ_KEY) or 0), revisions, conversation_id)
    return revisions[conversation_id]


def _readable(scope: Scope, row: dict[str, Any]) -> bool:
    """Whether the scope may read the memory a change is about (gone: unrestricted only)."""
    if row["kind"] is None:
        return scope.user_id is None and scope.categories is None
    memory = {
        "kind": row["kind"],
        "category": row["category"],
        "user_id": row["user_id"],
        "conversation_id": row["memory_conversation"],
        "session_id": row["session_id"],
        "attributes": row["attributes"],
    }
    return scope.allows(memory)


def delta_header(since: int, rows: list[dict[str, Any]]) -> str:
    """The delta header: "Memory updates since rev X:" and up to 3 bullets such as
    "- +created: [preferences] Sam loves pizza (imp=3)"; "" when nothing changed.

    One bullet per memory, its net change (see the module doc); rows carry the memory's
    current `memory_state` when known.
    """
    ordered = sorted(rows, key=lambda r: (_time(r["ts"]), r["rev"]))
    new_since: set[str] = set()
    latest: dict[str, dict[str, Any]] = {}
    for row in ordered:
        memory_id = row["memory_id"]
        if memory_id is None:
            latest[row["event"]] = row
            continue
        event = row["event"]
        if event == "created" or (event == "updated" and row["meta"].get("replaces") in new_since):
            new_since.add(memory_id)
            row = {**row, "event": "created"}
        latest[memory_id] = row
    shown = [
        row
        for row in latest.values()
        if row["event"] not in _PRESENT_EVENTS or row.get("memory_state", "active") == "active"
    ]
    newest = sorted(shown, key=lambda r: (_time(r["ts"]), r["rev"]), reverse=True)
    bullets = [_bullet(row) for row in newest[:MAX_DELTA_BULLETS]]
    return "\n".join([f"Memory updates since rev {since}:", *bullets]) if bullets else ""


def _time(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _bullet(row: dict[str, Any]) -> str:
    event = row["event"]
    text = (row["content"] or row["meta"].get("text") or row["memory_id"] or "").rstrip(". ")
    category = f"[{row['category']}] " if row.get("category") else ""
    importance = f" (imp={row['importance']})" if event == "created" and row["importance"] else ""
    return f"- {_CHANGE_SYMBOL.get(event, '*')}{event}: {category}{text}{importance}"
