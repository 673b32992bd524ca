"""Stage 2 (asset `chunks`): notes and episodes → chunks, for files whose content changed.

The rows themselves are built in `chunk_rows.py`; this stage reads and writes the store.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.index.chunks_fts import make_empty_index
from memory_dag.index.early_turns import MAX_TURNS, lay_new_turns, new_turns
from memory_dag.ingest.chunk_rows import (
    CHUNK_SCHEMA,
    TURN_COLUMNS,
    note_chunk_rows,
    transcript_chunk_rows,
)
from memory_dag.ingest.files import ERROR_SCHEMA
from memory_dag.reports import PREVIEW_ROWS, StageReport, StageTimer
from memory_dag.store.connection import (
    fetch_dicts,
    insert_arrow,
    listed,
    open_store,
)
from memory_dag.warm_up import load_embedder_in_background


def _now() -> datetime:
    return datetime.now(UTC)


@progress.tracked("chunks")
def build_chunks(settings: Settings, *, force: bool = False) -> StageReport:
    """(Re)chunk every file whose content changed since its chunks were made."""
    report = StageReport("chunks")
    with StageTimer(report), open_store(settings.db_path) as con:
        where = "" if force else "WHERE chunked_hash IS DISTINCT FROM hash"
        pending = fetch_dicts(
            con,
            f"SELECT path, kind, source, hash, conversation_id, session_id FROM files {where}",
        )
        # A new store: DuckDB's FTS index is made while `chunks` is still empty, so that the
        # index step fills it with its own SQL, not the extension's slower build.
        if pending and make_empty_index(con):
            report.notes.append("DuckDB's FTS index made empty, for the index step to fill")
        now = _now()
        transcripts = {p["path"] for p in pending if p["kind"] == "transcript"}
        written = 0
        failed: list[tuple[dict[str, Any], str]] = []
        # The turns to lay early, kept only up to the most that `lay_new_turns` lays.
        early: list[pa.Table] = []
        early_rows = 0
        # Files go through in groups, each in a transaction of its own: every file's turns,
        # their rendered, stripped and search texts and their chunk rows held at once took
        # ~6 KB a turn (2 GB at 300k), and with one transaction over all the groups the
        # step peaked at 5.0 GB at 1M turns (2.5 GB with a commit a group). A group
        # deletes its files' old chunks, writes the new ones and marks its files chunked, so
        # a run cut short leaves whole groups done and the next run chunks the rest.
        # The next group's rows are made on a thread while this one is written: DuckDB's
        # insert and Polars' and tiktoken's work let go of the GIL, so the two overlap.
        groups = [
            pending[start : start + CHUNK_FILES_BATCH]
            for start in range(0, len(pending), CHUNK_FILES_BATCH)
        ]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-rows") as rows_maker:
            upcoming = _start_rows(rows_maker, con, groups[0], settings, now) if groups else None
            for index, group in enumerate(groups):
                assert upcoming is not None
                rows, group_failed = upcoming.result()
                if index + 1 < len(groups):
                    upcoming = _start_rows(rows_maker, con, groups[index + 1], settings, now)
                _write_group(con, group, rows, group_failed, now)
                written += rows.num_rows
                failed += group_failed
                if early_rows <= MAX_TURNS:
                    turns = new_turns(rows, transcripts)
                    early.append(turns)
                    early_rows += turns.num_rows
                del rows
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
            "written": written,
            "files_failed": len(failed),
        }
        report.errors = [{"path": f["path"], "line": None, "reason": r} for f, r in failed]
        # New turns are searchable now, not after the index step; and before the store is
        # closed, since closing checkpoints the write-ahead log (a second or more at 100k).
        laid = pa.concat_tables(early) if early else CHUNK_SCHEMA.empty_table()
        report.counts["turns_searchable_early"] = lay_new_turns(settings, laid, transcripts)
        if pending:  # the next stages embed: the model loads while closing checkpoints
            load_embedder_in_background(settings)
    return report


#: Files chunked (and their rows written) at a time: 2,000 session files of 20 turns each.
CHUNK_FILES_BATCH = 2_000


def _start_rows(
    rows_maker: ThreadPoolExecutor,
    con: Any,
    group: list[dict[str, Any]],
    settings: Settings,
    now: datetime,
) -> Future[tuple[pa.Table, list[tuple[dict[str, Any], str]]]]:
    """Read a group's notes and turns, and start making its chunk rows on `rows_maker`."""
    notes, episodes = _read_group(con, group)
    return rows_maker.submit(_chunk_rows, group, notes, episodes, settings, now)


def _write_group(
    con: Any,
    group: list[dict[str, Any]],
    rows: pa.Table,
    failed: list[tuple[dict[str, Any], str]],
    now: datetime,
) -> None:
    """Write a group of files in one transaction: old chunks out, new chunks and the errors
    of the files that failed in, every file of the group marked chunked."""
    con.execute("BEGIN TRANSACTION")
    try:
        # Paths as an Arrow view, not a bound list (`store.connection.listed`: ~0.1 ms a
        # value; the bound lists of every pending file took ~2 s at 5k files).
        with listed(con, "chunk_paths", [p["path"] for p in group]):
            con.execute("DELETE FROM chunks WHERE path IN (SELECT value FROM chunk_paths)")
            insert_arrow(con, "chunks", rows)
            insert_arrow(con, "ingest_errors", _error_rows(failed, now))
            con.execute(
                "UPDATE files SET chunked_hash = hash WHERE path IN (SELECT value FROM chunk_paths)"
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _read_group(
    con: Any, group: list[dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], pl.DataFrame]:
    """The notes (by path) and the turns of a group of pending files."""
    with listed(con, "chunk_paths", [p["path"] for p in group]):
        notes = {
            row["path"]: row
            for row in fetch_dicts(
                con,
                "SELECT path, body, body_start_line, created_at FROM notes "
                "WHERE path IN (SELECT value FROM chunk_paths)",
            )
        }
        episodes = con.execute(
            f"SELECT path, {', '.join(TURN_COLUMNS)} FROM episodes "
            "WHERE path IN (SELECT value FROM chunk_paths) ORDER BY path, line"
        ).pl()
    return notes, episodes


def _chunk_rows(
    pending: list[dict[str, Any]],
    notes: dict[str, dict[str, Any]],
    episodes: pl.DataFrame,
    settings: Settings,
    now: datetime,
) -> tuple[pa.Table, list[tuple[dict[str, Any], str]]]:
    """Chunk rows of every pending file, and (file, reason) for files that could not be chunked.

    All files go in one batch (fast); should the batch fail, each file is chunked alone so
    one file's problem costs that file only, recorded once instead of failing every run.
    """
    sizes = {"max_tokens": settings.chunk_tokens, "overlap": settings.chunk_overlap}

    def rows_of(files: list[dict[str, Any]], turns: pl.DataFrame) -> pa.Table:
        return pa.concat_tables(
            [
                note_chunk_rows(files, notes, now=now, **sizes),
                transcript_chunk_rows(
                    files, turns, max_turns=settings.session_chunk_turns, now=now, **sizes
                ),
            ]
        )

    try:
        return rows_of(pending, episodes), []
    except Exception:  # find the file that broke the batch
        pass
    tables: list[pa.Table] = []
    failed: list[tuple[dict[str, Any], str]] = []
    for file in pending:
        try:
            tables.append(rows_of([file], episodes.filter(pl.col("path") == file["path"])))
        except Exception as error:
            failed.append((file, f"could not be chunked: {type(error).__name__}: {error}"[:500]))
    return (pa.concat_tables(tables) if tables else CHUNK_SCHEMA.empty_table()), failed


def _error_rows(failed: list[tuple[dict[str, Any], str]], now: datetime) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "path": f["path"],
                "line": None,
                "reason": r,
                "file_hash": f["hash"],
                "recorded_at": now,
            }
            for f, r in failed
        ],
        schema=ERROR_SCHEMA,
    )
