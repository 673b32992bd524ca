"""Read-only views of the memory store for agents and people: counts, an entity's profile,
the audit trail of one memory. Each reads through a `Scope` (`memory_dag/scope.py`): only the
memories the scope may read are listed, and a scoped store needs a user.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from memory_dag.config import Settings
from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.journal import JOURNAL_SEQ_KEY
from memory_dag.memories.writer import MemoryOpError
from memory_dag.scope import Scope
from memory_dag.store.connection import fetch_dicts, get_meta, listed, open_store

#: Columns `Scope.allows` reads.
_SCOPE_COLUMNS = "m.kind, m.user_id, m.conversation_id, m.session_id, m.category, m.attributes"


def stats(settings: Settings, *, scope: Scope | None = None) -> dict[str, Any]:
    """Counts by kind (active, soft-deleted), the latest record the scope may read, entities,
    relations, sessions."""
    scope = scope or Scope()
    with open_store(settings.db_path, read_only=True) as con:
        scope.check_connection(con)
        kinds = fetch_dicts(
            con,
            "SELECT kind, count(*) FILTER (WHERE valid_until IS NULL AND state = 'active') "
            "AS active, count(*) FILTER (WHERE valid_until IS NOT NULL OR state <> 'active') "
            "AS soft_deleted, max(created_at) AS latest_at FROM memories GROUP BY kind "
            "ORDER BY kind",
        )
        recent = fetch_dicts(
            con,
            f"SELECT m.id, m.created_at, m.content, {_SCOPE_COLUMNS} FROM memories m "
            "ORDER BY m.created_at DESC, m.id DESC LIMIT 200",
        )
        latest = [
            {k: row[k] for k in ("id", "kind", "conversation_id", "created_at", "content")}
            for row in scope.filter(recent)[:1]
        ]
        counts = con.execute(
            "SELECT (SELECT count(*) FROM entities), (SELECT count(*) FROM memory_entities), "
            "(SELECT count(*) FROM relations), "
            "(SELECT count(*) FROM sessions_consolidations WHERE consolidated_at IS NULL), "
            "(SELECT count(*) FROM sessions_consolidations WHERE consolidated_at IS NOT NULL)"
        ).fetchone()
    return {
        "kinds": {row.pop("kind"): row for row in kinds},
        "latest": latest[0] if latest else None,
        "entities": int(counts[0]),
        "entity_links": int(counts[1]),
        "relations": int(counts[2]),
        "sessions": {"pending": int(counts[3]), "consolidated": int(counts[4])},
    }


def entity_profile(
    settings: Settings, name: str, *, limit: int = 20, scope: Scope | None = None
) -> list[dict[str, Any]]:
    """Entities called `name` (canonical name or alias, any case) with the active memories the
    scope may read, facts first, newest first (seed 004 `get_entity_info`)."""
    scope = scope or Scope()
    with open_store(settings.db_path, read_only=True) as con:
        scope.check_connection(con)
        entities = fetch_dicts(
            con,
            "SELECT id, canonical_name, type, aliases, mention_count, summary, created_at, "
            "updated_at FROM entities WHERE lower(canonical_name) = lower(?) "
            "OR list_contains(list_transform(aliases, lambda a: lower(a)), lower(?)) "
            "ORDER BY mention_count DESC, canonical_name",
            [name.strip(), name.strip()],
        )
        for entity in entities:
            linked = scope.filter(
                fetch_dicts(
                    con,
                    f"SELECT m.id, m.speaker, m.event_time, m.content, l.mention, {_SCOPE_COLUMNS} "
                    "FROM memory_entities l JOIN memories m ON m.id = l.memory_id "
                    "WHERE l.entity_id = ? AND m.valid_until IS NULL AND m.state = 'active' "
                    "ORDER BY m.kind <> 'fact', coalesce(m.event_time, m.created_at) DESC, m.id",
                    [entity["id"]],
                )
            )
            counts: dict[str, int] = {}
            for row in linked:
                counts[row["kind"]] = counts.get(row["kind"], 0) + 1
            entity["memory_counts"] = dict(sorted(counts.items()))
            entity["memories"] = [
                {key: row[key] for key in _PROFILE_COLUMNS} for row in linked[:limit]
            ]
    return entities


_PROFILE_COLUMNS = (
    "id", "kind", "category", "conversation_id", "speaker", "event_time", "content", "mention"
)  # fmt: skip


def memory_history(
    settings: Settings,
    memory_id: str,
    *,
    scope: Scope | None = None,
    lock_timeout: float | None = None,
) -> dict[str, Any]:
    """The memory and every history row that names it (as the subject, old or new reference),
    and the journal position the store has folded; AccessDenied when the scope may not read
    the memory."""
    scope = scope or Scope()
    with open_store(settings.db_path, read_only=True, lock_timeout=lock_timeout) as con:
        scope.check_connection(con)
        rows = fetch_dicts(
            con,
            "SELECT id, kind, state, content, category, importance, conversation_id, session_id, "
            "user_id, agent_id, speaker, event_time, created_at, valid_until, purge_at, "
            "confidence, decay_rate, source_ids, replaced_by, supersedes, attributes "
            "FROM memories WHERE id = ?",
            [memory_id],
        )
        if not rows:
            raise MemoryOpError(f"no memory {memory_id}")
        scope.check_target(rows[0])
        events = fetch_dicts(
            con,
            "SELECT ts, event, memory_id, old_ref, new_ref, actor, meta FROM history "
            "WHERE ? IN (memory_id, old_ref, new_ref) ORDER BY ts, id",
            [memory_id],
        )
        folded = int(get_meta(con, JOURNAL_SEQ_KEY) or 0)
    for event in events:
        event["meta"] = json.loads(event["meta"]) if event["meta"] else {}
    return {"memory": rows[0], "history": events, "journal_seq": folded}


def user_export(
    settings: Settings, scope: Scope, *, lock_timeout: float | None = None
) -> dict[str, Any]:
    """Everything the store holds that the scope's user owns (seed 003 §8: history exportable
    per user): its memories in any state, their history rows, and the journal position the
    store has folded (`journal_seq`: live writes after it are not in these rows yet)."""
    if scope.user_id is None:
        raise AccessDenied("an export is for one user: name the user")
    with open_store(settings.db_path, read_only=True, lock_timeout=lock_timeout) as con:
        scope.check_connection(con)
        memories = scope.filter(
            fetch_dicts(
                con,
                "SELECT * FROM memories WHERE user_id = ? AND kind <> 'episode' "
                "ORDER BY created_at, id",
                [scope.user_id],
            ),
            across_conversations=True,
        )
        with listed(con, "_export_memories", [row["id"] for row in memories]):
            history = fetch_dicts(
                con,
                "SELECT id, ts, event, memory_id, old_ref, new_ref, actor, meta FROM history "
                "WHERE memory_id IN (SELECT value FROM _export_memories) ORDER BY ts, id",
            )
        folded = int(get_meta(con, JOURNAL_SEQ_KEY) or 0)
    for event in history:
        event["meta"] = json.loads(event["meta"]) if event["meta"] else {}
    return {"memories": memories, "history": history, "journal_seq": folded}


#: Transcript turns that say what a newer statement contradicted, replaced or asked to forget:
#: the source episodes of facts soft-deleted by DELETE or UPDATE (never by decay, TTL or a
#: merge, which keep or fade the information without contradicting it), with their successor.
_SUPERSEDED_SQL = """
    SELECT DISTINCT unnest(m.source_ids) AS episode, coalesce(m.replaced_by, h.new_ref) AS by
    FROM memories m JOIN history h ON h.memory_id = m.id AND h.event IN ('DELETE', 'UPDATE')
    WHERE m.kind = 'fact' AND (m.valid_until IS NOT NULL OR m.state <> 'active')
"""


def superseded_turns(
    con: Any, conversation_ids: Sequence[str] | None = None
) -> dict[str, str | None]:
    """episode id -> the memory that superseded what the turn said (None: forgotten, or the
    contradicting fact is not known), for turns a newer statement overruled. Read on an open
    connection; restricted to these conversations when given."""
    query = (
        f"SELECT s.episode, s.by FROM ({_SUPERSEDED_SQL}) s "
        "JOIN memories e ON e.id = s.episode AND e.kind = 'episode'"
    )
    if conversation_ids is None:
        return dict(con.execute(query + " ORDER BY 1, 2 NULLS FIRST").fetchall())
    # A view, not a bound list: the summaries stage asks for hundreds of conversations.
    with listed(con, "_superseded_of", list(conversation_ids)):
        query += " WHERE e.conversation_id IN (SELECT value FROM _superseded_of)"
        return dict(con.execute(query + " ORDER BY 1, 2 NULLS FIRST").fetchall())
