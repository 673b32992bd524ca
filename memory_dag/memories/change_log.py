"""The change log read back (seed 003 §1): what changed after a revision, and the delta
header an agent is shown ("Memory updates since rev X: ...").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from memory_dag.config import Settings
from memory_dag.store.connection import fetch_dicts, open_store

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


@dataclass
class Delta:
    """Changes after revision `since` (seed 003 §1) and the header an agent is shown."""

    since: int
    revisions: dict[str, int]
    changes: list[dict[str, Any]]
    header: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def changes(settings: Settings, since: int, conversation_id: str | None = None) -> Delta:
    """What changed after revision `since`, oldest first, with the delta header.

    Revisions count per conversation. With `conversation_id` None every conversation is read,
    each against its own revision. The header holds at most 3 bullets: the latest change of
    each memory, newest first; it is empty when nothing changed.
    """
    where = "c.rev > ?"
    params: list[Any] = [since]
    if conversation_id is not None:
        where += " AND c.conversation_id = ?"
        params.append(conversation_id)
    with open_store(settings.db_path, read_only=True) as con:
        rows = fetch_dicts(
            con,
            "SELECT c.conversation_id, c.rev, c.event, c.memory_id, c.ts, c.meta, m.kind, "
            "m.category, m.importance, m.content FROM change_log c "
            f"LEFT JOIN memories m ON m.id = c.memory_id WHERE {where} "
            "ORDER BY c.conversation_id, c.rev",
            params,
        )
        revision_rows = con.execute(
            "SELECT conversation_id, rev FROM conversation_revisions"
            + (" WHERE conversation_id = ?" if conversation_id is not None else ""),
            [conversation_id] if conversation_id is not None else [],
        ).fetchall()
    for row in rows:
        row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
    revisions = {conversation: int(rev) for conversation, rev in revision_rows}
    if conversation_id is not None:
        revisions.setdefault(conversation_id, 0)
    return Delta(since, revisions, rows, delta_header(since, rows))


def delta_header(since: int, rows: list[dict[str, Any]]) -> str:
    """The delta header: "Memory updates since rev X:" and up to 3 bullets such as
    "- +created: [preferences] Sam loves pizza (imp=3)"; "" when nothing changed."""
    latest: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["ts"], r["rev"])):
        latest[row["memory_id"] or row["event"]] = row
    newest = sorted(latest.values(), key=lambda r: (r["ts"], r["rev"]), reverse=True)
    bullets = [_bullet(row) for row in newest[:MAX_DELTA_BULLETS]]
    return "\n".join([f"Memory updates since rev {since}:", *bullets]) if bullets else ""


def _bullet(row: dict[str, Any]) -> str:
    event = row["event"]
    text = (row["content"] or row["meta"].get("text") or row["memory_id"] or "").rstrip(". ")
    category = f"[{row['category']}] " if row.get("category") else ""
    importance = f" (imp={row['importance']})" if event == "created" and row["importance"] else ""
    return f"- {_CHANGE_SYMBOL.get(event, '*')}{event}: {category}{text}{importance}"
