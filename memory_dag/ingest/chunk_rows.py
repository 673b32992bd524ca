"""Rows of the `chunks` table: what a chunk shows, what it is searched by, and its ids.

Notes are cut into chunks of lines (`chunking.chunk_lines`), transcripts into chunks of
turns (`chunking.chunk_turns`). With the default of one turn a chunk
(`session_chunk_turns = 1`) a session needs no packing at all, only columns: each turn's
rendered text, its token count and its search text. Those sessions are done column by
column in Polars, all of them at once (100k turns in ~3 s, against ~12 s one Python object
at a time). Sessions that need real packing (several turns a chunk, or a turn longer than
the budget, cut into pieces) go through `chunk_turns` one by one. Both give the same rows
(`tests/ingest/test_chunk_rows.py`).

A chunk's `text` is what was written or said, shown to users; its `search_text` is what is
embedded and BM25-indexed (see `search_text.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl
import pyarrow as pa

from memory_dag.ids import chunk_id, text_hash
from memory_dag.index.search_text import (
    participant_names,
    strip_names,
    strip_names_expr,
    transcript_search_text,
)
from memory_dag.ingest.chunking import Chunk, chunk_lines, chunk_turns
from memory_dag.ingest.sources import Turn, render_turn
from memory_dag.ingest.tokens import count_tokens_batch

_TS = pa.timestamp("us", tz="UTC")
CHUNK_SCHEMA = pa.schema(
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

#: Columns of the episodes frame that `transcript_chunk_rows` reads, in `Turn`'s field order.
TURN_COLUMNS = [
    "turn_id",
    "session_id",
    "conversation_id",
    "role",
    "speaker",
    "content",
    "event_time",
    "line",
]

#: Columns of a `files` row that every chunk of the file carries.
FILE_COLUMNS = ("path", "source", "kind", "hash", "conversation_id", "session_id")

ChunkView = tuple[str, str | None, str | None, datetime | None]  # search, speaker, role, time


# --- notes -----------------------------------------------------------------------------------


def note_chunk_rows(
    files: list[dict[str, Any]],
    notes: dict[str, dict[str, Any]],
    *,
    max_tokens: int,
    overlap: int,
    now: datetime,
) -> pa.Table:
    """Chunks of the Markdown notes and entries in `files` (`notes`: their rows by path)."""
    rows: list[dict[str, Any]] = []
    for file in files:
        note = notes.get(file["path"])
        if note is None:
            continue
        chunks = chunk_lines(
            note["body"], first_line=note["body_start_line"], max_tokens=max_tokens, overlap=overlap
        )
        for number, chunk in enumerate(chunks):
            view = (chunk.text, None, None, note["created_at"])
            rows.append(_chunk_row(file, number, chunk, view, now))
    return pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA)


# --- transcripts -----------------------------------------------------------------------------


def transcript_chunk_rows(
    files: list[dict[str, Any]],
    episodes: pl.DataFrame,
    *,
    max_tokens: int,
    overlap: int,
    max_turns: int | None,
    now: datetime,
) -> pa.Table:
    """Chunks of the transcripts in `files`.

    `episodes` holds their turns (`path` and `TURN_COLUMNS`), ordered by path and line.
    """
    turns = _with_turn_columns(episodes)
    if turns.is_empty():
        return CHUNK_SCHEMA.empty_table()
    files_by_path = {file["path"]: file for file in files}
    # A session is columnar when each of its turns is one chunk exactly as it is.
    columnar_paths = pl.Series([], dtype=pl.String)
    if max_turns == 1:
        fits = turns.group_by("path").agg(fits=(pl.col("tokens") <= max_tokens).all())
        columnar_paths = fits.filter("fits")["path"]
    is_columnar = pl.col("path").is_in(columnar_paths.implode())  # one list: the paths
    tables = [
        _single_turn_rows(turns.filter(is_columnar), files_by_path, now),
        _packed_rows(
            turns.filter(~is_columnar),
            files_by_path,
            max_tokens=max_tokens,
            overlap=overlap,
            max_turns=max_turns,
            now=now,
        ),
    ]
    return pa.concat_tables(tables)


def _with_turn_columns(episodes: pl.DataFrame) -> pl.DataFrame:
    """Episodes plus each turn's rendered text, token count and name-stripped content."""
    # `render_turn` in Polars; roles are "user" or "assistant" (sources.KEPT_ROLES).
    role_label = pl.col("role").str.slice(0, 1).str.to_uppercase() + pl.col("role").str.slice(1)
    turns = episodes.with_columns(
        rendered=pl.format("{}: {}", pl.coalesce("speaker", role_label), pl.col("content"))
    )
    return turns.with_columns(
        tokens=pl.Series(count_tokens_batch(turns["rendered"].to_list()), dtype=pl.Int32),
        stripped=_name_stripped(turns),
    )


def _name_stripped(turns: pl.DataFrame) -> pl.Series:
    """Each turn's content without its session's participant names.

    Sessions with the same participants (a conversation's) share one regex; the groups are
    stripped in parallel (`collect_all`).
    """
    if turns.is_empty():
        return turns["content"]
    speakers = turns.group_by("path", maintain_order=True).agg(pl.col("speaker").unique())
    groups: dict[tuple[str, ...], int] = {}
    group_of = {
        path: groups.setdefault(participant_names(names), len(groups))
        for path, names in speakers.iter_rows()
    }
    contents = turns.lazy().select(
        "content",
        group=pl.col("path").replace_strict(group_of, return_dtype=pl.Int64),
        row=pl.int_range(pl.len()),
    )
    stripped = pl.collect_all(
        contents.filter(pl.col("group") == key).select(
            "row", stripped=strip_names_expr(pl.col("content"), names)
        )
        for names, key in groups.items()
    )
    return pl.concat(stripped).sort("row")["stripped"]


def _single_turn_rows(
    turns: pl.DataFrame, files_by_path: dict[str, dict[str, Any]], now: datetime
) -> pa.Table:
    """One chunk per turn, in columns: what `_packed_rows` gives when nothing is packed."""
    if turns.is_empty():
        return CHUNK_SCHEMA.empty_table()
    previous = pl.col("stripped").shift(1).over("path")
    file_columns = pl.DataFrame(
        [{name: file[name] for name in FILE_COLUMNS} for file in files_by_path.values()],
        schema=dict.fromkeys(FILE_COLUMNS, pl.String),
    ).rename(lambda name: name if name in ("path", "source", "kind") else f"file_{name}")
    frame = turns.with_columns(
        number=pl.int_range(pl.len()).over("path"),
        # `transcript_search_text`: the previous turn and this one, empty parts left out.
        search_text=pl.concat_str(
            [
                pl.when(previous != "").then(previous),
                pl.when(pl.col("stripped") != "").then(pl.col("stripped")),
            ],
            separator=" ",
            ignore_nulls=True,
        ),
    ).join(file_columns, on="path", how="left", maintain_order="left")
    ids = [
        chunk_id(path, file_hash, number)
        for path, file_hash, number in zip(
            frame["path"].to_list(),
            frame["file_hash"].to_list(),
            frame["number"].to_list(),
            strict=True,
        )
    ]
    hashes = [text_hash(text) for text in frame["search_text"].to_list()]
    table = frame.select(
        id=pl.Series(ids, dtype=pl.String),
        path="path",
        source="source",
        kind="kind",
        start_line="line",
        end_line="line",
        hash=pl.Series(hashes, dtype=pl.String),
        text="rendered",
        search_text="search_text",
        speaker="speaker",
        role="role",
        tokens="tokens",
        turn_ids=pl.concat_list("turn_id"),
        conversation_id="file_conversation_id",
        session_id="file_session_id",
        event_time=pl.col("event_time").dt.convert_time_zone("UTC"),
        updated_at=pl.lit(now).dt.convert_time_zone("UTC"),
    ).to_arrow()
    return table.cast(CHUNK_SCHEMA)


def _packed_rows(
    turns: pl.DataFrame,
    files_by_path: dict[str, dict[str, Any]],
    *,
    max_tokens: int,
    overlap: int,
    max_turns: int | None,
    now: datetime,
) -> pa.Table:
    """Chunks of sessions that need packing, one session at a time through `chunk_turns`."""
    rows: list[dict[str, Any]] = []
    if turns.is_empty():
        return pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA)
    for (path,), session in turns.partition_by("path", as_dict=True, maintain_order=True).items():
        file_turns = [Turn(*row) for row in session.select(TURN_COLUMNS).iter_rows()]
        chunks = chunk_turns(
            file_turns,
            max_tokens=max_tokens,
            overlap=overlap,
            max_turns=max_turns,
            counts=session["tokens"].to_list(),
        )
        views = _transcript_views(file_turns, chunks, session["stripped"].to_list())
        file = files_by_path[path]
        for number, (chunk, view) in enumerate(zip(chunks, views, strict=True)):
            rows.append(_chunk_row(file, number, chunk, view, now))
    return pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA)


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


# --- shared ----------------------------------------------------------------------------------


def _chunk_row(
    file: dict[str, Any], number: int, chunk: Chunk, view: ChunkView, now: datetime
) -> dict[str, Any]:
    search, speaker, role, event_time = view
    return {
        "id": chunk_id(file["path"], file["hash"], number),
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
