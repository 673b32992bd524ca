"""New transcript turns, searchable before the run reaches its index step.

A new session file goes through files, chunks, facts, entities, summaries and embeddings
before the index step publishes it: tens of seconds at 100k turns on a busy machine. Its
turns need none of that to be found. So the chunks stage lays the turns of new transcript
files beside the published version at once, in the delta segment (`delta.py`), exactly as a
live write lays the turns it records (`memories/live_writer.py`): a `put` of the turn's
episode with its search row (the chunk row the next version will hold, embedded now). Every
reader lays it over the version it has; once a version indexes the turn (its path and turn
id), readers skip the record and the next compaction drops it. When the files stage deletes
or re-reads the file, its laid turns leave the delta at once (`delta.drop_laid_turns`; a
re-read file's turns are laid again): a deleted session is never found again. Facts and the
summary of the new session are searchable when the index step publishes them.

The turns of changed files are laid too: a reader skips a turn its version already indexes
(by path and turn id), so only the new ones show, once. Only when a version is published,
and only up to `MAX_TURNS` (a large import waits for the index step instead of embedding
twice).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.ids import episode_id

#: More new turns than this in one run wait for the index step.
MAX_TURNS = 2000


def new_turns(chunks: pa.Table, new_files: set[str]) -> pa.Table:
    """The chunks that `lay_new_turns` would lay: one turn each, of a new transcript file."""
    import pyarrow.compute as pc

    return chunks.filter(
        pc.and_(
            pc.and_(
                pc.equal(chunks.column("kind"), "transcript"),
                pc.is_in(chunks.column("path"), value_set=pa.array(sorted(new_files), pa.string())),
            ),
            pc.equal(pc.list_value_length(chunks.column("turn_ids")), 1),
        )
    )


def lay_new_turns(settings: Settings, chunks: pa.Table, new_files: set[str]) -> int:
    """Append delta records for the transcript chunks of `new_files` (new or changed files,
    one turn a chunk); returns how many turns were laid."""
    from memory_dag.index.published import current_version

    if not new_files or current_version(settings.index_dir) is None or not chunks.num_rows:
        return 0
    turns = new_turns(chunks, new_files)
    if not turns.num_rows or turns.num_rows > MAX_TURNS:  # counted before any row is built
        return 0
    rows = turns.to_pylist()
    from memory_dag.embed.providers import get_provider
    from memory_dag.index.delta import (
        EARLY_TURN_EVENT,
        append_records,
        compact,
        delta_path,
        last_seq,
        record,
    )
    from memory_dag.index.published import cached_index
    from memory_dag.memories.journal import Journal
    from memory_dag.memories.live_writer import COMPACT_BYTES

    provider = get_provider(settings)
    vectors = provider.embed([row["search_text"] for row in rows])
    model = f"{provider.name}/{provider.model}"
    now = datetime.now(UTC)
    journal = Journal(settings.workspace)
    with journal.lock():  # the delta's writers are serialised by the journal's lock
        # The delta's position stays the journal's: these records add no live write.
        seq = max(journal.last_seq(), last_seq(settings.index_dir))
        records = [
            record(
                seq,
                now,
                "put",
                EARLY_TURN_EVENT,
                _episode(row, now),
                search=_search_row(row),
                vector=vector,
                model=model,
            )  # fmt: skip
            for row, vector in zip(rows, vectors, strict=True)
        ]
        append_records(settings.index_dir, records)
        # Records the live version holds fall away as live writers' do (`delta.compact`):
        # without live writes, nothing else would shorten the file readers read.
        if delta_path(settings.index_dir).stat().st_size > COMPACT_BYTES:
            compact(settings.index_dir, cached_index(settings.index_dir))
    return len(records)


def _episode(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    [turn_id] = row["turn_ids"]
    return {
        "id": episode_id(row["path"], turn_id),
        "kind": "episode",
        "content": row["text"],
        "path": row["path"],
        "turn_id": turn_id,
        "conversation_id": row["conversation_id"],
        "session_id": row["session_id"],
        "user_id": None,
        "source_role": row["role"],
        "speaker": row["speaker"],
        "event_time": row["event_time"],
        "created_at": now,
        "state": "active",
    }


def _search_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row `search_documents` gives the chunk (the next version's row for it)."""
    return {
        "id": row["id"],
        "kind": row["kind"],
        "source": row["source"],
        "path": row["path"],
        "start_line": row["start_line"],
        "end_line": row["end_line"],
        "text": row["text"],
        "search_text": row["search_text"],
        "speaker": row["speaker"],
        "turn_ids": list(row["turn_ids"]),
        "conversation_id": row["conversation_id"],
        "session_id": row["session_id"],
        "event_time": row["event_time"],
        "role": row["role"],
        "category": None,
        "user_id": None,  # turns are shared by their conversation (scope.py)
        "agent_id": None,
        "importance": None,
        "pinned": False,
        "updated_at": row["updated_at"],
    }
