"""Read-only views of the memory store for agents and people: counts, an entity's profile,
the audit trail of one memory.
"""

from __future__ import annotations

import json
from typing import Any

from memory_dag.config import Settings
from memory_dag.memories.writer import MemoryOpError
from memory_dag.store.connection import fetch_dicts, open_store


def stats(settings: Settings) -> dict[str, Any]:
    """Counts by kind (active, soft-deleted), the latest record, entities, relations, sessions."""
    with open_store(settings.db_path, read_only=True) as con:
        kinds = fetch_dicts(
            con,
            "SELECT kind, count(*) FILTER (WHERE valid_until IS NULL AND state = 'active') "
            "AS active, count(*) FILTER (WHERE valid_until IS NOT NULL OR state <> 'active') "
            "AS soft_deleted, max(created_at) AS latest_at FROM memories GROUP BY kind "
            "ORDER BY kind",
        )
        latest = fetch_dicts(
            con,
            "SELECT id, kind, conversation_id, created_at, content FROM memories "
            "ORDER BY created_at DESC, id DESC LIMIT 1",
        )
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


def entity_profile(settings: Settings, name: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """Entities called `name` (canonical name or alias, any case) with their active memories,
    facts first, newest first (seed 004 `get_entity_info`)."""
    with open_store(settings.db_path, read_only=True) as con:
        entities = fetch_dicts(
            con,
            "SELECT id, canonical_name, type, aliases, mention_count, summary, created_at, "
            "updated_at FROM entities WHERE lower(canonical_name) = lower(?) "
            "OR list_contains(list_transform(aliases, lambda a: lower(a)), lower(?)) "
            "ORDER BY mention_count DESC, canonical_name",
            [name.strip(), name.strip()],
        )
        for entity in entities:
            entity["memories"] = fetch_dicts(
                con,
                "SELECT m.id, m.kind, m.category, m.conversation_id, m.speaker, m.event_time, "
                "m.content, l.mention FROM memory_entities l JOIN memories m ON m.id = l.memory_id "
                "WHERE l.entity_id = ? AND m.valid_until IS NULL AND m.state = 'active' "
                "ORDER BY m.kind <> 'fact', coalesce(m.event_time, m.created_at) DESC, m.id "
                "LIMIT ?",
                [entity["id"], limit],
            )
            entity["memory_counts"] = dict(
                con.execute(
                    "SELECT m.kind, count(*) FROM memory_entities l JOIN memories m "
                    "ON m.id = l.memory_id WHERE l.entity_id = ? AND m.valid_until IS NULL "
                    "AND m.state = 'active' GROUP BY m.kind ORDER BY m.kind",
                    [entity["id"]],
                ).fetchall()
            )
    return entities


def memory_history(settings: Settings, memory_id: str) -> dict[str, Any]:
    """The memory and every history row that names it (as the subject, old or new reference)."""
    with open_store(settings.db_path, read_only=True) as con:
        rows = fetch_dicts(
            con,
            "SELECT id, kind, state, content, category, importance, conversation_id, session_id, "
            "speaker, event_time, created_at, valid_until, purge_at, confidence, decay_rate, "
            "source_ids, replaced_by, supersedes FROM memories WHERE id = ?",
            [memory_id],
        )
        if not rows:
            raise MemoryOpError(f"no memory {memory_id}")
        events = fetch_dicts(
            con,
            "SELECT ts, event, memory_id, old_ref, new_ref, actor, meta FROM history "
            "WHERE ? IN (memory_id, old_ref, new_ref) ORDER BY ts, id",
            [memory_id],
        )
    for event in events:
        event["meta"] = json.loads(event["meta"]) if event["meta"] else {}
    return {"memory": rows[0], "history": events}
