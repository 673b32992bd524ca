"""Which conversations an ingest run must summarize, and whether any file changed: read before
the run from the filesystem and the store, without the summarizer's imports (a run that finds
nothing due should cost little more than this scan)."""

from __future__ import annotations

from pathlib import Path

from memory_dag.config import Settings
from memory_dag.ingest.watch import WorkspaceChanges, changed_conversations, scan_workspace
from memory_dag.store.connection import open_store

#: Conversations whose files or facts changed after their last successful summarization.
_STALE_SQL = """
    WITH last AS (
        SELECT conversation_id, max(ts) AS ts FROM events
        WHERE node = 'summaries' AND op = 'summarize' AND status = 'ok' GROUP BY 1)
    SELECT f.conversation_id FROM files f LEFT JOIN last USING (conversation_id)
    WHERE f.conversation_id IS NOT NULL AND (last.ts IS NULL OR f.indexed_at > last.ts)
    UNION
    SELECT m.conversation_id FROM memories m JOIN last USING (conversation_id)
    WHERE m.kind = 'fact' AND greatest(m.created_at, m.valid_until) > last.ts
"""


def workspace_due(settings: Settings) -> tuple[list[str], WorkspaceChanges]:
    """`conversations_due`, and every file the store has not read yet (notes too)."""
    previous: dict[str, list] = {}
    stale: set[str] = set()
    if Path(settings.db_path).exists():
        with open_store(settings.db_path, read_only=True) as con:
            for path, size, mtime, digest in con.execute(
                "SELECT path, size, mtime, hash FROM files"
            ).fetchall():
                previous[path] = [size, mtime, digest]
            stale = {row[0] for row in con.execute(_STALE_SQL).fetchall()}
    changes, _ = scan_workspace(
        Path(settings.workspace),
        previous,
        debounce_seconds=0,
        extra_roots=settings.workspace_extra_roots,
        hash_new=False,  # only which files changed is wanted: a new one is not read
    )
    return sorted(set(changed_conversations(changes)) | stale), changes
