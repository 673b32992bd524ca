"""Stage 1 (asset `workspace_files`): workspace files → files, notes, episodes, ingest_errors.

Incremental by size, mtime and content hash; a bad file or line becomes an `ingest_errors`
row and never stops the rest. Idempotent: a second run with no change writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.ids import episode_id
from memory_dag.ingest.sources import (
    IngestError,
    ParsedFile,
    SourceFile,
    Turn,
    discover_files,
    file_stat,
    parse_event_time,
    read_source,
)
from memory_dag.parallel import process_slices
from memory_dag.reports import PREVIEW_ROWS, StageReport, StageTimer
from memory_dag.store.connection import (
    fetch_dicts,
    insert_arrow,
    is_lock_error,
    listed,
    open_store,
)


def _now() -> datetime:
    return datetime.now(UTC)


@progress.tracked("files")
def sync_files(settings: Settings, *, force: bool = False) -> StageReport:
    """Bring the store in line with the workspace: new, changed and deleted files.

    Unchanged files (same size and mtime, or same content hash) are not re-read into rows.
    Bad input is recorded in `ingest_errors` and never stops the other files or lines.
    """
    report = StageReport("files")
    with StageTimer(report):
        discovered = discover_files(settings.workspace, settings.workspace_extra_roots)
        with open_store(settings.db_path) as con:
            known = {
                row[0]: (row[1], row[2], row[3])
                for row in con.execute("SELECT path, hash, mtime, size FROM files").fetchall()
            }

        parsed: list[ReadFile] = []
        touched: list[tuple[str, float]] = []  # same content, new mtime
        to_read = [
            source_file
            for source_file in discovered
            if force
            or (previous := known.get(source_file.rel_path)) is None
            or not _same_stat(source_file, previous)
        ]
        unchanged = len(discovered) - len(to_read)
        for result in read_files(to_read):
            previous = known.get(result.file.rel_path)
            if previous is not None and previous[0] == result.parsed.hash and not force:
                touched.append((result.file.rel_path, result.parsed.mtime))
                unchanged += 1
                continue
            parsed.append(result)

        present = {f.rel_path for f in discovered}
        deleted = sorted(set(known) - present)
        new = [p for p in parsed if p.file.rel_path not in known]
        changed = [p for p in parsed if p.file.rel_path in known]

        with open_store(settings.db_path) as con:
            try:
                episodes = _write_changes(con, parsed, deleted + [p.file.rel_path for p in changed])
            except Exception as error:  # one file's rows broke the batch: find it, keep the rest
                if is_lock_error(error):
                    raise
                episodes = _write_file_by_file(con, parsed, deleted)
            for rel_path, mtime in touched:
                con.execute("UPDATE files SET mtime = ? WHERE path = ?", [mtime, rel_path])
            report.preview = fetch_dicts(
                con,
                "SELECT path, source, kind, size, conversation_id, session_id FROM files "
                "ORDER BY indexed_at DESC, path LIMIT ?",
                [PREVIEW_ROWS],
            )
            total_files = con.execute("SELECT count(*) FROM files").fetchone()[0]
        _forget_laid_turns(settings, deleted + [p.file.rel_path for p in changed])

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


def _forget_laid_turns(settings: Settings, paths: list[str]) -> None:
    """The turns the chunks stage laid in the delta segment from these files (deleted, or
    changed: their turns are laid again by the chunks stage) stop being searchable now."""
    from memory_dag.index.delta import delta_path, drop_laid_turns
    from memory_dag.memories.journal import Journal

    if not paths or not delta_path(settings.index_dir).exists():
        return
    with Journal(settings.workspace).lock():  # the delta's writers are serialised by it
        drop_laid_turns(settings.index_dir, paths)


def _same_stat(source_file: SourceFile, previous: tuple[str, float, int]) -> bool:
    """True when size and mtime match what the store holds (the cheap "unchanged" test)."""
    if source_file.refused is not None:
        return False  # never stat a refused link; its fingerprint decides
    try:
        size, mtime = file_stat(source_file.path)
    except OSError:
        return False  # vanished or unreadable now: reading records why
    return (size, mtime) == (previous[2], previous[1])


#: Below this many files to read, they are read in this process (the workers' start costs
#: ~1 s, and a new session file or two is the usual change).
READ_IN_WORKERS_MIN_FILES = 1_000
#: Files a worker reads at a time, at most (~20k turns of 20-turn sessions): a worker keeps
#: the memory its largest slice took (a quarter of a 1M-turn workspace each: ~1 GB between
#: the two workers for the rest of the run).
READ_SLICE_FILES = 1_000


@dataclass(slots=True)
class ReadFile:
    """One file read and parsed. A transcript's turns are laid out already as the turn columns
    of their `memories` rows (`episodes`), and `parsed` keeps the rest of what was read, less
    those turns and the transcript's text (nothing after the parse reads them)."""

    parsed: ParsedFile
    #: A transcript's turns are rows `first` to `first + turns` of `laid`, the table its worker
    #: handed back for the slice of files it read (None: not a transcript).
    laid: pa.Table | None = None
    first: int = 0
    turns: int = 0

    @property
    def episodes(self) -> pa.Table | None:
        """The turn columns of this file's episodes (None: not a transcript)."""
        return None if self.laid is None else self.laid.slice(self.first, self.turns)

    @property
    def file(self) -> SourceFile:
        return self.parsed.file

    @property
    def errors(self) -> list[IngestError]:
        return self.parsed.errors


def read_files(files: Sequence[SourceFile]) -> list[ReadFile]:
    """Read and parse `files`, in order; many files are read in worker processes.

    A worker hands back its slice's turns as one Arrow table: parsed turns cost more to
    pickle back than to parse, and so does a table a file (~0.3 ms each).
    """
    read: list[ReadFile] = []
    slices = process_slices(
        _read_slice, files, min_items=READ_IN_WORKERS_MIN_FILES, max_slice=READ_SLICE_FILES
    )
    for part in slices:
        offset = 0
        for parsed, turns in zip(part.parsed, part.turns, strict=True):
            if turns is None:
                read.append(ReadFile(parsed))
            else:
                read.append(ReadFile(parsed, part.episodes, offset, turns))
                offset += turns
    return read


@dataclass(slots=True)
class _ReadSlice:
    """Consecutive files read by one worker: `turns[i]` rows of `episodes` are those of
    `parsed[i]`, in order (None: not a transcript)."""

    parsed: list[ParsedFile]
    episodes: pa.Table
    turns: list[int | None]


def _read_slice(files: Sequence[SourceFile]) -> _ReadSlice:
    parsed: list[ParsedFile] = []
    episodes = _EpisodeColumns()  # every transcript's turns of the slice, file after file
    turns: list[int | None] = []
    for source_file in files:
        item = _read(source_file)
        parsed.append(item)
        if item.file.kind != "transcript":
            turns.append(None)
            continue
        # The id collisions join the file's errors: the report shows them, `ingest_errors`
        # keeps them.
        before = episodes.rows()
        episodes.add(item.file.rel_path, item.turns, item.errors)
        turns.append(episodes.rows() - before)
        item.turns, item.text = [], None
    return _ReadSlice(parsed, episodes.turn_table(), turns)


def _read(source_file: SourceFile) -> ParsedFile:
    """`read_source`, and a file-level error row should reading itself ever fail."""
    try:
        return read_source(source_file)
    except Exception as error:  # a bug on odd input must cost one file, not the ingest
        reason = f"could not be read: {type(error).__name__}: {error}"[:500]
        return ParsedFile.unread(source_file, reason, source_file.fingerprint or "")


def _write_changes(con: Any, parsed: list[ReadFile], gone: list[str]) -> int:
    """Replace the rows of changed and deleted files in one transaction; episodes written."""
    con.execute("BEGIN TRANSACTION")
    try:
        _delete_file_rows(con, gone)
        episodes = _write_parsed(con, parsed)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return episodes


def _write_file_by_file(con: Any, parsed: list[ReadFile], deleted: list[str]) -> int:
    """The batch failed: write each file alone; a file that still fails keeps only its
    `files` row and one error row, so it is not retried until it changes."""
    episodes = _write_changes(con, [], deleted)
    for item in parsed:
        try:
            episodes += _write_changes(con, [item], [item.file.rel_path])
        except Exception as error:
            if is_lock_error(error):
                raise
            reason = f"could not be stored: {type(error).__name__}: {error}"[:500]
            kept = item.parsed
            kept.text, kept.front_matter, kept.turns = None, {}, []
            kept.errors = [IngestError(item.file.rel_path, None, reason)]
            item.laid = None
            _write_changes(con, [item], [item.file.rel_path])
    return episodes


def _delete_file_rows(con: Any, paths: list[str]) -> None:
    if not paths:
        return
    # An Arrow view, not a bound list (`store.connection.listed`: ~0.1 ms a value).
    with listed(con, "_gone", paths):
        for table in ("notes", "chunks", "ingest_errors", "files"):
            con.execute(f"DELETE FROM {table} WHERE path IN (SELECT value FROM _gone)")
        con.execute(
            "DELETE FROM memories WHERE kind = 'episode' AND path IN (SELECT value FROM _gone)"
        )


def _write_parsed(con: Any, parsed: list[ReadFile]) -> int:
    now = _now()
    files_rows: list[dict[str, Any]] = []
    note_rows: list[dict[str, Any]] = []
    error_rows: list[dict[str, Any]] = []
    for read in parsed:
        item, source_file = read.parsed, read.file
        conversation_id, session_id = _file_scope(read)
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
        if source_file.kind != "transcript" and item.text is not None:
            note_rows.append(_note_row(item, conversation_id))
        error_rows.extend(
            {
                "path": e.path,
                "line": e.line,
                "reason": e.reason,
                "file_hash": item.hash,
                "recorded_at": now,
            }
            for e in item.errors
        )
    insert_arrow(con, "files", pa.Table.from_pylist(files_rows))
    insert_arrow(con, "notes", pa.Table.from_pylist(note_rows, schema=_NOTE_SCHEMA))
    written = insert_arrow(con, "memories", _episode_rows(parsed, now))
    insert_arrow(con, "ingest_errors", pa.Table.from_pylist(error_rows, schema=ERROR_SCHEMA))
    return written


def _file_scope(read: ReadFile) -> tuple[str | None, str | None]:
    item = read.parsed
    if item.file.kind == "transcript":
        session = item.file.path.stem
        turns = read.episodes
        has_turns = turns is not None and turns.num_rows > 0
        conversation = turns["conversation_id"][0].as_py() if has_turns else None
        if conversation is None:
            parent = item.file.rel_path.split("/")[1:-1]
            conversation = "/".join(parent) or None
        return conversation, session
    conversation = item.front_matter.get("conversation_id") if item.front_matter else None
    return (str(conversation) if conversation is not None else None), None


def _episode_rows(files: list[ReadFile], now: datetime) -> pa.Table:
    """The `memories` rows of the files' turns: their turn columns, and the columns that are
    the same in every row."""
    runs = _laid_runs(files)
    turns = pa.concat_tables(runs) if runs else _EPISODE_TURN_SCHEMA.empty_table()
    rows = turns.num_rows
    constants = {**_EPISODE_CONSTANTS, "created_at": now}
    arrays = [
        turns[field.name]
        if field.name not in constants
        else pa.array([constants[field.name]] * rows, type=field.type)
        for field in _EPISODE_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=_EPISODE_SCHEMA)


def _laid_runs(files: list[ReadFile]) -> list[pa.Table]:
    """The files' turns in as few pieces as they allow, none copied: consecutive files of one
    worker's slice are one slice of its table. DuckDB scans a few large pieces fast and many
    small ones several times slower; a copy into one piece took 0.6 GB at 1M turns."""
    runs: list[tuple[pa.Table, int, int]] = []  # table, first row, rows
    for read in files:
        if read.laid is None:
            continue
        if runs:
            table, first, rows = runs[-1]
            if table is read.laid and first + rows == read.first:  # the next rows of a run
                runs[-1] = (table, first, rows + read.turns)
                continue
        runs.append((read.laid, read.first, read.turns))
    return [table.slice(first, rows) for table, first, rows in runs]


class _EpisodeColumns:
    """Transcript turns as `memories` rows of kind 'episode', gathered column by column
    (100k turns: ~0.2 s, where a dict per row cost ~1 s)."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in _EPISODE_TURN_COLUMNS}

    def add(self, path: str, turns: list[Turn], errors: list[IngestError]) -> None:
        """The turns of one file; a repeated turn id is kept under a new one (and reported).

        The new id is the line id (`<session>:<line>`), or that with `~2`, `~3`... when another
        line already took it as its own id.
        """
        columns = self.columns
        seen: set[str] = set()
        for turn in turns:
            turn_id = turn.id
            if turn_id in seen:
                turn_id = f"{turn.session_id}:{turn.line}"
                copy = 1
                while turn_id in seen:
                    copy += 1
                    turn_id = f"{turn.session_id}:{turn.line}~{copy}"
                reason = f"duplicate turn id {turn.id!r}; kept as {turn_id!r}"
                error = IngestError(path, turn.line, reason)
                if error not in errors:  # the file may be written twice (file by file)
                    errors.append(error)
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
            columns["user_id"].append(turn.user_id)

    def rows(self) -> int:
        return len(self.columns["id"])

    def turn_table(self) -> pa.Table:
        """The gathered turn columns (`_EPISODE_TURN_SCHEMA`), one chunk a column."""
        arrays = [
            pa.array(self.columns[field.name], type=field.type) for field in _EPISODE_TURN_SCHEMA
        ]
        return pa.Table.from_arrays(arrays, schema=_EPISODE_TURN_SCHEMA)


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
    "user_id",
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
        "created_at": parse_event_time(fm.get("created_at")),
        "summary_kind": _str_or_none(fm.get("summary_kind")),
        "replaced_by": _str_or_none(fm.get("replaced_by")),
        "front_matter": _json_or_none(fm),
    }


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _json_or_none(value: dict[str, Any]) -> str | None:
    from memory_dag.store.connection import to_json

    return to_json(value) if value else None


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
        ("user_id", pa.string()),
    ]
)
_EPISODE_TURN_SCHEMA = pa.schema(
    [field for field in _EPISODE_SCHEMA if field.name in _EPISODE_TURN_COLUMNS]
)
ERROR_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("line", pa.int32()),
        ("reason", pa.string()),
        ("file_hash", pa.string()),
        ("recorded_at", _TS),
    ]
)
