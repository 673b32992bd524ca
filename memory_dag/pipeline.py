"""The ingest pipeline as plain functions: files → notes/episodes → chunks → embeddings → index.

Each stage opens the store briefly, does incremental work, and returns a `StageReport`
(counts, timings, a preview) that the Dagster assets turn into metadata and the CLI prints.
Every stage is idempotent: run it twice and the second run changes nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from memory_dag.chunking import Chunk, chunk_lines, chunk_turns
from memory_dag.config import Settings
from memory_dag.embeddings import get_provider
from memory_dag.index_files import FORMAT_VERSION, publish_index, read_manifest
from memory_dag.search_text import (
    participant_names,
    strip_names,
    strip_names_many,
    transcript_search_text,
)
from memory_dag.sources import (
    IngestError,
    ParsedFile,
    SourceFile,
    Turn,
    discover_files,
    file_stat,
    read_source,
    render_turn,
)
from memory_dag.store import fetch_dicts, get_meta, insert_arrow, load_fts, open_store, set_meta

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


def _digest(*parts: str) -> str:
    return hashlib.sha1("\x00".join(parts).encode("utf-8")).hexdigest()


def episode_id(path: str, turn_id: str) -> str:
    """Stable memory id of a transcript turn (turn ids are only unique within a file)."""
    return "ep_" + _digest(path, turn_id)[:20]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
    episode_rows: list[dict[str, Any]] = []
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
            episode_rows.extend(_episode_rows(source_file.rel_path, item.turns, errors, now))
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
    insert_arrow(con, "memories", pa.Table.from_pylist(episode_rows, schema=_EPISODE_SCHEMA))
    insert_arrow(con, "ingest_errors", pa.Table.from_pylist(error_rows, schema=_ERROR_SCHEMA))
    return len(episode_rows)


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


def _episode_rows(
    path: str, turns: list[Turn], errors: list[IngestError], now: datetime
) -> Iterator[dict[str, Any]]:
    seen: set[str] = set()
    for turn in turns:
        turn_id = turn.id
        if turn_id in seen:
            errors.append(
                IngestError(path, turn.line, f"duplicate turn id {turn_id!r}; kept as line id")
            )
            turn_id = f"{turn.session_id}:{turn.line}"
        seen.add(turn_id)
        yield {
            "id": episode_id(path, turn_id),
            "kind": "episode",
            "content": turn.content,
            "conversation_id": turn.conversation_id,
            "session_id": turn.session_id,
            "source_role": turn.role,
            "speaker": turn.speaker,
            "turn_id": turn_id,
            "path": path,
            "line": turn.line,
            "event_time": turn.event_time,
            "created_at": now,
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
        turns = _turns_by_path(con, [p["path"] for p in pending if p["kind"] == "transcript"])
        stripped = _name_stripped_contents(turns)
        now = _now()
        rows: list[dict[str, Any]] = []
        for file in pending:
            path = file["path"]
            if file["kind"] == "transcript":
                file_turns = turns.get(path, [])
                chunks = chunk_turns(
                    file_turns,
                    max_tokens=settings.chunk_tokens,
                    overlap=settings.chunk_overlap,
                    max_turns=settings.session_chunk_turns,
                )
                views = _transcript_views(file_turns, chunks, stripped.get(path, []))
            else:
                note = notes.get(path)
                chunks = (
                    chunk_lines(
                        note["body"],
                        first_line=note["body_start_line"],
                        max_tokens=settings.chunk_tokens,
                        overlap=settings.chunk_overlap,
                    )
                    if note
                    else []
                )
                created = note["created_at"] if note else None
                views = [(chunk.text, None, None, created) for chunk in chunks]
            for number, (chunk, view) in enumerate(zip(chunks, views, strict=True)):
                rows.append(_chunk_row(file, number, chunk, view, now))
        con.execute("BEGIN TRANSACTION")
        try:
            if pending:
                con.execute(
                    "DELETE FROM chunks WHERE path IN (SELECT unnest(?::TEXT[]))",
                    [[p["path"] for p in pending]],
                )
            insert_arrow(con, "chunks", pa.Table.from_pylist(rows, schema=_CHUNK_SCHEMA))
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
        report.counts = {"chunks": int(total), "files_chunked": len(pending), "written": len(rows)}
    return report


def _rows_by_path(con: Any, sql: str, paths: list[str]) -> dict[str, dict[str, Any]]:
    if not paths:
        return {}
    return {row["path"]: row for row in fetch_dicts(con, sql, [paths])}


def _turns_by_path(con: Any, paths: list[str]) -> dict[str, list[Turn]]:
    if not paths:
        return {}
    out: dict[str, list[Turn]] = {}
    episodes = con.execute(
        "SELECT path, turn_id, session_id, conversation_id, role, speaker, content, "
        "event_time, line FROM episodes WHERE path IN (SELECT unnest(?::TEXT[])) "
        "ORDER BY path, line",
        [paths],
    ).pl()  # through Polars: half the time of fetchall() at 100k turns
    for (
        path,
        turn_id,
        session,
        conversation,
        role,
        speaker,
        content,
        when,
        line,
    ) in episodes.iter_rows():
        out.setdefault(path, []).append(
            Turn(
                id=turn_id,
                session_id=session,
                conversation_id=conversation,
                role=role,
                speaker=speaker,
                content=content,
                event_time=when,
                line=line,
            )
        )
    return out


ChunkView = tuple[str, str | None, str | None, datetime | None]  # search, speaker, role, time


def _name_stripped_contents(turns: dict[str, list[Turn]]) -> dict[str, list[str]]:
    """Each turn's content without its session's participant names, computed in one Polars
    call per set of names (a conversation's sessions share one)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for path, file_turns in turns.items():
        groups.setdefault(participant_names(t.speaker for t in file_turns), []).append(path)
    out: dict[str, list[str]] = {}
    for names, paths in groups.items():
        contents = strip_names_many([t.content for p in paths for t in turns[p]], names)
        start = 0
        for path in paths:
            out[path] = contents[start : start + len(turns[path])]
            start += len(turns[path])
    return out


def _transcript_views(
    turns: list[Turn], chunks: list[Chunk], stripped: list[str]
) -> list[ChunkView]:
    """Search text, speaker and time of each transcript chunk (see `search_text.py`).

    `stripped[i]` is turn i's content without the participants' names.
    """
    names = participant_names(t.speaker for t in turns)
    position = {turn.id: i for i, turn in enumerate(turns)}
    labels = {render_turn(t).split(": ", 1)[0] for t in turns}
    views: list[ChunkView] = []
    for chunk in chunks:
        held = [turns[position[t]] for t in chunk.turn_ids if t in position]
        first = position.get(chunk.turn_ids[0]) if chunk.turn_ids else None
        previous = turns[first - 1] if first else None
        if len(held) == 1 and render_turn(held[0]) == chunk.text:
            at = position[held[0].id]
            search = transcript_search_text(stripped[at], stripped[at - 1] if at else None)
        else:  # several turns, or a piece of a long one: drop the "Speaker: " labels
            body = "\n".join(_without_label(line, labels) for line in chunk.text.split("\n"))
            context = previous.content + " " if previous is not None else ""
            search = strip_names(context + body, names)
        speakers = {t.speaker for t in held}
        speaker = held[0].speaker if len(speakers) == 1 and held else None
        roles = {t.role for t in held}
        role = held[0].role if len(roles) == 1 and held else None
        event_time = next((t.event_time for t in held if t.event_time), None)
        views.append((search, speaker, role, event_time))
    return views


def _without_label(line: str, labels: set[str]) -> str:
    label, sep, rest = line.partition(": ")
    return rest if sep and label in labels else line


def _chunk_row(
    file: dict[str, Any], number: int, chunk: Chunk, view: ChunkView, now: datetime
) -> dict[str, Any]:
    search, speaker, role, event_time = view
    return {
        "id": "ch_" + _digest(file["path"], file["hash"], str(number))[:20],
        "path": file["path"],
        "source": file["source"],
        "kind": file["kind"],
        "start_line": chunk.start_line,
        "end_line": chunk.end_line,
        "hash": text_hash(search),
        "text": chunk.text,
        "search_text": search,
        "speaker": speaker,
        "role": role,
        "tokens": chunk.tokens,
        "turn_ids": chunk.turn_ids,
        "conversation_id": file["conversation_id"],
        "session_id": file["session_id"],
        "event_time": event_time,
        "updated_at": now,
    }


_CHUNK_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("path", pa.string()),
        ("source", pa.string()),
        ("kind", pa.string()),
        ("start_line", pa.int32()),
        ("end_line", pa.int32()),
        ("hash", pa.string()),
        ("text", pa.string()),
        ("search_text", pa.string()),
        ("speaker", pa.string()),
        ("role", pa.string()),
        ("tokens", pa.int32()),
        ("turn_ids", pa.list_(pa.string())),
        ("conversation_id", pa.string()),
        ("session_id", pa.string()),
        ("event_time", _TS),
        ("updated_at", _TS),
    ]
)


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
            missing = con.execute(
                """
                SELECT DISTINCT c.hash, c.search_text FROM search_documents c
                WHERE NOT EXISTS (
                    SELECT 1 FROM embedding_cache e
                    WHERE e.provider = ? AND e.model = ? AND e.hash = c.hash)
                """,
                [provider.name, provider.model],
            ).fetchall()
        if previous[1] is not None and previous != (provider.name, provider.model):
            report.notes.append(
                f"embedding model changed from {previous[0]}/{previous[1]} to "
                f"{provider.name}/{provider.model}: every chunk is embedded again"
            )
        hashes = [row[0] for row in missing]
        texts = [row[1] for row in missing]
        batch = max(1, settings.embedding_batch_size) * 8
        bar = _progress_bar(len(texts), "embedding", progress)
        written = 0
        pending: list[pa.Table] = []

        def flush() -> int:
            # One connection per ~50k vectors: reopening (and checkpointing) per batch made
            # this stage quadratic; one insert at the very end would lose a crash's progress.
            if not pending:
                return 0
            with open_store(settings.db_path) as con:
                count = insert_arrow(con, "embedding_cache", pa.concat_tables(pending))
            pending.clear()
            return count

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
                written += flush()
            bar.update(len(vectors))
        written += flush()
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
            table = con.execute(
                """
                SELECT c.id, c.kind, c.source, c.path, c.start_line, c.end_line, c.text,
                       c.search_text, c.speaker, c.turn_ids, c.conversation_id, c.session_id,
                       c.event_time, c.role, c.category, c.user_id, c.agent_id, c.importance,
                       c.pinned, c.updated_at, e.embedding
                FROM search_documents c JOIN embedding_cache e
                  ON e.provider = ? AND e.model = ? AND e.hash = c.hash
                ORDER BY c.conversation_id NULLS FIRST, c.path, c.start_line, c.id
                """,
                [provider.name, provider.model],
            ).arrow()
            if hasattr(table, "read_all"):
                table = table.read_all()
            total_chunks = con.execute("SELECT count(*) FROM search_documents").fetchone()[0]
        vectors = _arrow_to_vectors(table.column("embedding"), provider.dims)
        manifest = publish_index(
            settings.index_dir,
            table.drop_columns(["embedding"]),
            vectors,
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
    return _digest(str(FORMAT_VERSION), provider, model, row[0])


def _chunks_fingerprint(con: Any) -> str:
    row = con.execute(
        "SELECT coalesce(md5(string_agg(id || ':' || hash, ',' ORDER BY id)), '') FROM chunks"
    ).fetchone()
    return row[0]


def _arrow_to_vectors(column: pa.ChunkedArray, dims: int) -> np.ndarray:
    if len(column) == 0:
        return np.zeros((0, dims), dtype=np.float32)
    flat = pa.concat_arrays([chunk.flatten() for chunk in column.chunks])
    return flat.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(column), -1)


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


def run_all(
    settings: Settings, *, force: bool = False, progress: bool = False
) -> list[StageReport]:
    """Every stage in order, in this process: what `memory-dag ingest --no-dagster` does."""
    return [
        sync_files(settings, force=force),
        build_chunks(settings, force=force),
        embed_chunks(settings, progress=progress),
        build_search_index(settings, force=force),
        build_fts_index(settings, force=force),
    ]


__all__ = [
    "StageReport",
    "SourceFile",
    "build_chunks",
    "build_fts_index",
    "build_search_index",
    "embed_chunks",
    "run_all",
    "sync_files",
]
