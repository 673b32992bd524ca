"""Stage 2 (asset `chunks`): notes and episodes → chunks, for files whose content changed.

The rows themselves are built in `chunk_rows.py`; this stage reads and writes the store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.ingest.chunk_rows import TURN_COLUMNS, note_chunk_rows, transcript_chunk_rows
from memory_dag.reports import PREVIEW_ROWS, StageReport, StageTimer
from memory_dag.store.connection import (
    fetch_dicts,
    insert_arrow,
    open_store,
)


def _now() -> datetime:
    return datetime.now(UTC)


@progress.tracked("chunks")
def build_chunks(settings: Settings, *, force: bool = False) -> StageReport:
    """(Re)chunk every file whose content changed since its chunks were made."""
    report = StageReport("chunks")
    with StageTimer(report), open_store(settings.db_path) as con:
        where = "" if force else "WHERE chunked_hash IS DISTINCT FROM hash"
        pending = fetch_dicts(
            con, f"SELECT path, kind, source, hash, conversation_id, session_id FROM files {where}"
        )
        notes = _rows_by_path(
            con,
            "SELECT path, body, body_start_line, created_at FROM notes "
            "WHERE path IN (SELECT unnest(?::TEXT[]))",
            [p["path"] for p in pending if p["kind"] != "transcript"],
        )
        episodes = con.execute(
            f"SELECT path, {', '.join(TURN_COLUMNS)} FROM episodes "
            "WHERE path IN (SELECT unnest(?::TEXT[])) ORDER BY path, line",
            [[p["path"] for p in pending if p["kind"] == "transcript"]],
        ).pl()
        now = _now()
        sizes = {"max_tokens": settings.chunk_tokens, "overlap": settings.chunk_overlap}
        rows = pa.concat_tables(
            [
                note_chunk_rows(pending, notes, now=now, **sizes),
                transcript_chunk_rows(
                    pending, episodes, max_turns=settings.session_chunk_turns, now=now, **sizes
                ),
            ]
        )
        con.execute("BEGIN TRANSACTION")
        try:
            if pending:
                con.execute(
                    "DELETE FROM chunks WHERE path IN (SELECT unnest(?::TEXT[]))",
                    [[p["path"] for p in pending]],
                )
            insert_arrow(con, "chunks", rows)
            con.execute(
                "UPDATE files SET chunked_hash = hash WHERE path IN (SELECT unnest(?::TEXT[]))",
                [[p["path"] for p in pending]],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        total = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
        report.preview = fetch_dicts(
            con,
            "SELECT id, path, start_line, end_line, tokens, left(text, 80) AS text FROM chunks "
            "ORDER BY updated_at DESC, path, start_line LIMIT ?",
            [PREVIEW_ROWS],
        )
        report.counts = {
            "chunks": int(total),
            "files_chunked": len(pending),
            "written": rows.num_rows,
        }
    return report


def _rows_by_path(con: Any, sql: str, paths: list[str]) -> dict[str, dict[str, Any]]:
    if not paths:
        return {}
    return {row["path"]: row for row in fetch_dicts(con, sql, [paths])}
