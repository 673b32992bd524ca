"""The ingest pipeline as plain functions: files → notes/episodes → chunks → embeddings → index.

Each stage opens the store briefly, does incremental work, and returns a `StageReport`
(counts, timings, a preview) that the Dagster assets turn into metadata and the CLI prints.
Every stage is idempotent: run it twice and the second run changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory_dag.chunk_rows import TURN_COLUMNS, note_chunk_rows, transcript_chunk_rows
from memory_dag.config import Settings
from memory_dag.embeddings import get_provider
from memory_dag.ids import digest, episode_id
from memory_dag.index_files import FORMAT_VERSION, publish_index, read_manifest
from memory_dag.sources import (
    IngestError,
    ParsedFile,
    SourceFile,
    Turn,
    discover_files,
    file_stat,
    read_source,
)
from memory_dag.store import (
    fetch_arrow,
    fetch_dicts,
    get_meta,
    insert_arrow,
    load_fts,
    open_store,
    set_meta,
)

PREVIEW_ROWS = 10
#: Embeddings are written to the store in groups of about this many rows.
EMBED_FLUSH_ROWS = 50_000


@dataclass
class StageReport:
    """What one stage did: shown as asset metadata in Dagster and printed by the CLI."""

    stage: str
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    preview: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: bool = False

    def line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        state = "unchanged, skipped" if self.skipped else counts
        return f"{self.stage:<16} {state}  ({self.seconds:.2f}s)"


class _Timer:
    def __init__(self, report: StageReport) -> None:
        self.report = report
        self.start = time.perf_counter()

    def __enter__(self) -> StageReport:
        return self.report

    def __exit__(self, *exc: object) -> None:
        self.report.seconds = round(time.perf_counter() - self.start, 3)


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# Stage 1: workspace files → files, notes, episodes, ingest_errors


def sync_files(settings: Settings, *, force: bool = False) -> StageReport:
    """Bring the store in line with the workspace: new, changed and deleted files.

    Unchanged files (same size and mtime, or same content hash) are not re-read into rows.
    Bad input is recorded in `ingest_errors` and never stops the other files or lines.
    """
    report = StageReport("files")
    with _Timer(report):
        discovered = discover_files(settings.workspace)
        with open_store(settings.db_path) as con:
            known = {
                row[0]: (row[1], row[2], row[3])
                for row in con.execute("SELECT path, hash, mtime, size FROM files").fetchall()
            }

        parsed: list[ParsedFile] = []
        touched: list[tuple[str, float]] = []  # same content, new mtime
        unchanged = 0
        for source_file in discovered:
            previous = known.get(source_file.rel_path)
            if previous is not None and not force:
                size, mtime = file_stat(source_file.path)
                if (size, mtime) == (previous[2], previous[1]):
                    unchanged += 1
                    continue
            result = read_source(source_file)
            if previous is not None and previous[0] == result.hash and not force:
                touched.append((source_file.rel_path, result.mtime))
                unchanged += 1
                continue
            parsed.append(result)

        present = {f.rel_path for f in discovered}
        deleted = sorted(set(known) - present)
        new = [p for p in parsed if p.file.rel_path not in known]
        changed = [p for p in parsed if p.file.rel_path in known]

        with open_store(settings.db_path) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                _delete_file_rows(con, deleted + [p.file.rel_path for p in changed])
                for rel_path, mtime in touched:
                    con.execute("UPDATE files SET mtime = ? WHERE path = ?", [mtime, rel_path])
                episodes = _write_parsed(con, parsed)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            report.preview = fetch_dicts(
                con,
                "SELECT path, source, kind, size, conversation_id, session_id FROM files "
                "ORDER BY indexed_at DESC, path LIMIT ?",
                [PREVIEW_ROWS],
            )
            total_files = con.execute("SELECT count(*) FROM files").fetchone()[0]

        errors = [e for p in parsed for e in p.errors]
        report.errors = [{"path": e.path, "line": e.line, "reason": e.reason} for e in errors]
        report.counts = {
            "files": int(total_files),
            "new": len(new),
            "changed": len(changed),
            "deleted": len(deleted),
            "unchanged": unchanged,
            "episodes_written": episodes,
            "errors": len(errors),
        }
    return report


def _delete_file_rows(con: Any, paths: list[str]) -> None:
    if not paths:
        return
    con.execute("CREATE OR REPLACE TEMP TABLE _gone AS SELECT unnest(?::TEXT[]) AS path", [paths])
    for table in ("notes", "chunks", "ingest_errors", "files"):
        con.execute(f"DELETE FROM {table} WHERE path IN (SELECT path FROM _gone)")
    con.execute("DELETE FROM memories WHERE kind = 'episode' AND path IN (SELECT path FROM _gone)")
    con.execute("DROP TABLE _gone")


def _write_parsed(con: Any, parsed: list[ParsedFile]) -> int:
    now = _now()
    files_rows: list[dict[str, Any]] = []
    note_rows: list[dict[str, Any]] = []
    episodes = _EpisodeColumns()
    error_rows: list[dict[str, Any]] = []
    for item in parsed:
        source_file = item.file
        conversation_id, session_id = _file_scope(item)
        files_rows.append(
            {
                "path": source_file.rel_path,
                "source": source_file.source,
                "kind": source_file.kind,
                "hash": item.hash,
                "mtime": item.mtime,
                "size": item.size,
                "conversation_id": conversation_id,
                "session_id": session_id,
                "indexed_at": now,
            }
        )
        errors = list(item.errors)
        if source_file.kind == "transcript":
            episodes.add(source_file.rel_path, item.turns, errors)
        elif item.text is not None:
            note_rows.append(_note_row(item, conversation_id))
        error_rows.extend(
            {
                "path": e.path,
                "line": e.line,
                "reason": e.reason,
                "file_hash": item.hash,
                "recorded_at": now,
            }
            for e in errors
        )
    insert_arrow(con, "files", pa.Table.from_pylist(files_rows))
    insert_arrow(con, "notes", pa.Table.from_pylist(note_rows, schema=_NOTE_SCHEMA))
    written = insert_arrow(con, "memories", episodes.table(now))
    insert_arrow(con, "ingest_errors", pa.Table.from_pylist(error_rows, schema=_ERROR_SCHEMA))
    return written


def _file_scope(item: ParsedFile) -> tuple[str | None, str | None]:
    if item.file.kind == "transcript":
        session = item.file.path.stem
        conversation = item.turns[0].conversation_id if item.turns else None
        if conversation is None:
            parent = item.file.rel_path.split("/")[1:-1]
            conversation = "/".join(parent) or None
        return conversation, session
    conversation = item.front_matter.get("conversation_id") if item.front_matter else None
    return (str(conversation) if conversation is not None else None), None


class _EpisodeColumns:
    """Transcript turns as `memories` rows of kind 'episode', gathered column by column
    (100k turns: ~0.2 s, where a dict per row cost ~1 s)."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in _EPISODE_TURN_COLUMNS}

    def add(self, path: str, turns: list[Turn], errors: list[IngestError]) -> None:
        """The turns of one file; a repeated turn id is kept under its line (and reported)."""
        columns = self.columns
        seen: set[str] = set()
        for turn in turns:
            turn_id = turn.id
            if turn_id in seen:
                errors.append(
                    IngestError(path, turn.line, f"duplicate turn id {turn_id!r}; kept as line id")
                )
                turn_id = f"{turn.session_id}:{turn.line}"
            seen.add(turn_id)
            columns["id"].append(episode_id(path, turn_id))
            columns["content"].append(turn.content)
            columns["conversation_id"].append(turn.conversation_id)
            columns["session_id"].append(turn.session_id)
            columns["source_role"].append(turn.role)
            columns["speaker"].append(turn.speaker)
            columns["turn_id"].append(turn_id)
            columns["path"].append(path)
            columns["line"].append(turn.line)
            columns["event_time"].append(turn.event_time)

    def table(self, now: datetime) -> pa.Table:
        rows = len(self.columns["id"])
        constants = {**_EPISODE_CONSTANTS, "created_at": now}
        arrays = [
            pa.array(self.columns[field.name], type=field.type)
            if field.name in self.columns
            else pa.array([constants[field.name]] * rows, type=field.type)
            for field in _EPISODE_SCHEMA
        ]
        return pa.Table.from_arrays(arrays, schema=_EPISODE_SCHEMA)


#: Columns of an episode row that come from its turn; the others are the same in every row.
_EPISODE_TURN_COLUMNS = (
    "id",
    "content",
    "conversation_id",
    "session_id",
    "source_role",
    "speaker",
    "turn_id",
    "path",
    "line",
    "event_time",
)
_EPISODE_CONSTANTS: dict[str, Any] = {
    "kind": "episode",
    "decay_rate": 0.0,  # raw turns are the record; facts decay, episodes do not
}


def _note_row(item: ParsedFile, conversation_id: str | None) -> dict[str, Any]:
    fm = item.front_matter or {}
    return {
        "path": item.file.rel_path,
        "kind": item.file.kind,
        "body": item.body,
        "body_start_line": item.body_start_line,
        "entry_id": _str_or_none(fm.get("id")),
        "role": _str_or_none(fm.get("role")),
        "conversation_id": conversation_id,
        "created_at": _parse_time(fm.get("created_at")),
        "summary_kind": _str_or_none(fm.get("summary_kind")),
        "replaced_by": _str_or_none(fm.get("replaced_by")),
        "front_matter": _json_or_none(fm),
    }


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _json_or_none(value: dict[str, Any]) -> str | None:
    from memory_dag.store import to_json

    return to_json(value) if value else None


def _parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


_TS = pa.timestamp("us", tz="UTC")
_NOTE_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("kind", pa.string()),
        ("body", pa.string()),
        ("body_start_line", pa.int32()),
        ("entry_id", pa.string()),
        ("role", pa.string()),
        ("conversation_id", pa.string()),
        ("created_at", _TS),
        ("summary_kind", pa.string()),
        ("replaced_by", pa.string()),
        ("front_matter", pa.string()),
    ]
)
_EPISODE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("kind", pa.string()),
        ("content", pa.string()),
        ("conversation_id", pa.string()),
        ("session_id", pa.string()),
        ("source_role", pa.string()),
        ("speaker", pa.string()),
        ("turn_id", pa.string()),
        ("path", pa.string()),
        ("line", pa.int32()),
        ("event_time", _TS),
        ("created_at", _TS),
        ("decay_rate", pa.float64()),
    ]
)
_ERROR_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("line", pa.int32()),
        ("reason", pa.string()),
        ("file_hash", pa.string()),
        ("recorded_at", _TS),
    ]
)


# ---------------------------------------------------------------------------------------------
# Stage 2: notes and episodes → chunks


def build_chunks(settings: Settings, *, force: bool = False) -> StageReport:
    """(Re)chunk every file whose content changed since its chunks were made."""
    report = StageReport("chunks")
    with _Timer(report), open_store(settings.db_path) as con:
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


# ---------------------------------------------------------------------------------------------
# Stage 3: chunks → embedding_cache


def embed_chunks(settings: Settings, *, progress: bool = False) -> StageReport:
    """Embed every chunk text the cache does not hold yet for the configured model.

    The cache is keyed by (provider, model, text hash): identical text is embedded once,
    across files and runs. Switching model is recorded in `store_meta` and leads to a full
    re-embed under the new key; the index only ever reads vectors of the current model.
    """
    report = StageReport("embeddings")
    with _Timer(report):
        provider = get_provider(settings)
        with open_store(settings.db_path) as con:
            previous = (get_meta(con, "embedding_provider"), get_meta(con, "embedding_model"))
            missing = fetch_arrow(
                con,
                """
                SELECT DISTINCT c.hash, c.search_text FROM search_documents c
                WHERE NOT EXISTS (
                    SELECT 1 FROM embedding_cache e
                    WHERE e.provider = ? AND e.model = ? AND e.hash = c.hash)
                """,
                [provider.name, provider.model],
            )
        if previous[1] is not None and previous != (provider.name, provider.model):
            report.notes.append(
                f"embedding model changed from {previous[0]}/{previous[1]} to "
                f"{provider.name}/{provider.model}: every chunk is embedded again"
            )
        hashes = missing.column("hash").to_pylist()
        texts = missing.column("search_text").to_pylist()
        batch = max(1, settings.embedding_batch_size) * 8
        bar = _progress_bar(len(texts), "embedding", progress)
        pending: list[pa.Table] = []
        # Vectors are written by a second thread while the next texts are embedded (DuckDB
        # lets go of the GIL while it writes): at 100k chunks that hides ~2 s of writing.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-writer") as writer:
            writes: list[Future[int]] = []

            def flush() -> None:
                if pending:
                    rows = pa.concat_tables(pending)
                    writes.append(writer.submit(_write_embeddings, settings.db_path, rows))
                    pending.clear()

            for start in range(0, len(texts), batch):
                vectors = provider.embed(texts[start : start + batch])
                pending.append(
                    pa.table(
                        {
                            "provider": pa.array([provider.name] * len(vectors)),
                            "model": pa.array([provider.model] * len(vectors)),
                            "hash": pa.array(hashes[start : start + batch]),
                            "dims": pa.array([provider.dims] * len(vectors), type=pa.int32()),
                            "embedding": _vectors_to_arrow(vectors),
                            "created_at": pa.array([_now()] * len(vectors), type=_TS),
                        }
                    )
                )
                if sum(t.num_rows for t in pending) >= EMBED_FLUSH_ROWS:
                    flush()
                bar.update(len(vectors))
            flush()
            written = sum(write.result() for write in writes)
        bar.close()
        with open_store(settings.db_path) as con:
            set_meta(con, "embedding_provider", provider.name)
            set_meta(con, "embedding_model", provider.model)
            set_meta(con, "embedding_dims", str(provider.dims))
            cached = con.execute(
                "SELECT count(*) FROM embedding_cache WHERE provider = ? AND model = ?",
                [provider.name, provider.model],
            ).fetchone()[0]
        report.counts = {"embedded": written, "cached": int(cached), "dims": provider.dims}
        report.notes.append(f"model {provider.name}/{provider.model}, {provider.dims} dims")
    return report


def _write_embeddings(db_path: Path, rows: pa.Table) -> int:
    """One group of vectors in one short connection: each group that is written stays
    written if the run stops later (one connection per batch made the stage quadratic, as
    every close checkpoints the growing table)."""
    with open_store(db_path) as con:
        return insert_arrow(con, "embedding_cache", rows)


def _vectors_to_arrow(vectors: np.ndarray) -> pa.Array:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(vectors.reshape(-1)))


def _progress_bar(total: int, label: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="chunk", disable=not enabled or total == 0)


# ---------------------------------------------------------------------------------------------
# Stage 4: chunks + embeddings → published FAISS + BM25 index


def build_search_index(settings: Settings, *, force: bool = False) -> StageReport:
    """Publish a new index version when chunks or the model changed since the live one."""
    report = StageReport("search_index")
    with _Timer(report):
        provider = get_provider(settings)
        with open_store(settings.db_path) as con:
            fingerprint = _index_fingerprint(con, provider.name, provider.model)
            live = read_manifest(settings.index_dir)
            if not force and live is not None and live.get("fingerprint") == fingerprint:
                report.skipped = True
                report.counts = {"rows": int(live["count"]), "dims": int(live["dims"])}
                return report
            # Rows and vectors come in two queries (one snapshot) and are matched by hash in
            # Arrow: sorting rows that carry their vectors made DuckDB move ~1 KB a row.
            con.execute("BEGIN TRANSACTION")
            table = fetch_arrow(
                con,
                """
                SELECT c.id, c.kind, c.source, c.path, c.start_line, c.end_line, c.text,
                       c.search_text, c.speaker, c.turn_ids, c.conversation_id, c.session_id,
                       c.event_time, c.role, c.category, c.user_id, c.agent_id, c.importance,
                       c.pinned, c.updated_at, c.hash
                FROM search_documents c
                WHERE c.hash IN (
                    SELECT hash FROM embedding_cache WHERE provider = ? AND model = ?)
                ORDER BY c.conversation_id NULLS FIRST, c.path, c.start_line, c.id
                """,
                [provider.name, provider.model],
            )
            embedded = fetch_arrow(
                con,
                f"SELECT hash, embedding::FLOAT[{int(provider.dims)}] AS embedding "
                "FROM embedding_cache WHERE provider = ? AND model = ? "
                "AND hash IN (SELECT hash FROM search_documents)",
                [provider.name, provider.model],
            )
            total_chunks = con.execute("SELECT count(*) FROM search_documents").fetchone()[0]
            con.execute("COMMIT")
        vectors = _arrow_to_vectors(embedded.column("embedding"), provider.dims)
        positions = pc.index_in(table.column("hash"), value_set=embedded.column("hash"))
        manifest = publish_index(
            settings.index_dir,
            table.drop_columns(["hash"]),
            vectors[positions.to_numpy(zero_copy_only=False)],
            provider=provider.name,
            model=provider.model,
            fingerprint=fingerprint,
        )
        not_embedded = int(total_chunks) - table.num_rows
        if not_embedded:
            report.notes.append(f"{not_embedded} documents have no embedding yet: not indexed")
        report.counts = {
            "rows": int(manifest["count"]),
            "dims": int(manifest["dims"]),
            "not_embedded": not_embedded,
        }
        report.notes.append(f"version {manifest['version']}, faiss {manifest['faiss_type']}")
    return report


def _index_fingerprint(con: Any, provider: str, model: str) -> str:
    row = con.execute(
        "SELECT coalesce(md5(string_agg(id || ':' || hash, ',' ORDER BY id)), '') "
        "FROM search_documents"
    ).fetchone()
    return digest(str(FORMAT_VERSION), provider, model, row[0])


def _chunks_fingerprint(con: Any) -> str:
    row = con.execute(
        "SELECT coalesce(md5(string_agg(id || ':' || hash, ',' ORDER BY id)), '') FROM chunks"
    ).fetchone()
    return row[0]


def _arrow_to_vectors(column: pa.ChunkedArray, dims: int) -> np.ndarray:
    """A (rows × dims) float32 matrix from a FLOAT[dims] column (read-only if not copied)."""
    if len(column) == 0:
        return np.zeros((0, dims), dtype=np.float32)
    parts = [chunk.flatten().to_numpy().reshape(len(chunk), dims) for chunk in column.chunks]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------------------------------------
# Stage 5: DuckDB full-text index over chunks, for people who query with SQL


def build_fts_index(settings: Settings, *, force: bool = False) -> StageReport:
    """(Re)build DuckDB's FTS index on `chunks` so `fts_main_chunks.match_bm25` works in SQL."""
    report = StageReport("chunks_fts")
    with _Timer(report), open_store(settings.db_path) as con:
        how = load_fts(con)
        fingerprint = _chunks_fingerprint(con)
        if not force and get_meta(con, "fts_fingerprint") == fingerprint:
            report.skipped = True
            return report
        rows = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
        con.execute(
            "PRAGMA create_fts_index('chunks', 'id', 'text', stemmer = 'porter', "
            "stopwords = 'english', overwrite = 1)"
        )
        set_meta(con, "fts_fingerprint", fingerprint)
        report.counts = {"rows": int(rows)}
        report.notes.append(f"fts extension loaded from {how}")
    return report


# ---------------------------------------------------------------------------------------------


def refresh_search_index(settings: Settings) -> list[StageReport]:
    """Embed what is missing, then publish the index: a write elsewhere becomes searchable."""
    return [embed_chunks(settings), build_search_index(settings)]


def build_indexes(
    settings: Settings, *, force: bool = False, search_index: bool = True, fts: bool = True
) -> Iterator[StageReport]:
    """The search index and DuckDB's FTS index, built side by side; reports as they finish.

    DuckDB builds its FTS index on one core, in C++, without holding the GIL, so it can run
    next to the FAISS + BM25 build (at 100k chunks, ~14 s for both against ~16 s one after
    the other). Its thread gets a lower priority, so that the search index, which agents are
    waiting for, is published about as soon as when it is built alone. The search index is
    reported first; a failure of one build does not stop the other.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fts-build") as background:
        fts_build = (
            background.submit(_in_background, build_fts_index, settings, force) if fts else None
        )
        if search_index:
            yield build_search_index(settings, force=force)
        if fts_build is not None:
            yield fts_build.result()


#: Nice value of background builds: they take the CPU the search index leaves over.
BACKGROUND_NICE = 19


def _in_background(
    build: Callable[..., StageReport], settings: Settings, force: bool
) -> StageReport:
    if sys.platform.startswith("linux"):  # Linux gives each thread its own nice value
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    return build(settings, force=force)


def run_all(
    settings: Settings, *, force: bool = False, progress: bool = False
) -> list[StageReport]:
    """Every stage in order, in this process: what `memory-dag ingest --no-dagster` does."""
    return [
        sync_files(settings, force=force),
        build_chunks(settings, force=force),
        embed_chunks(settings, progress=progress),
        *build_indexes(settings, force=force),
    ]


__all__ = [
    "StageReport",
    "SourceFile",
    "build_chunks",
    "build_fts_index",
    "build_indexes",
    "build_search_index",
    "embed_chunks",
    "run_all",
    "sync_files",
]
