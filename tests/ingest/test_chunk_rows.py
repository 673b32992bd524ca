"""Transcript chunk rows: the columnar path (one turn a chunk) gives exactly the rows that
packing turn by turn gives, and sessions that need packing still get it."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from memory_dag.ids import chunk_id
from memory_dag.ingest.chunk_rows import (
    CHUNK_SCHEMA,
    _packed_rows,
    _single_turn_rows,
    _with_turn_columns,
    transcript_chunk_rows,
)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
WORDS = [
    "paint",
    "sunset",
    "lake",
    "pottery",
    "class",
    "kids",
    "support",
    "group",
    "yesterday",
    "powerful",
    "camping",
]
NAMES = [("Caroline", "Melanie"), ("Jon Snow", "Gina"), (None, None)]


def session_rows(path: str, conversation: str | None, names: tuple, turns: int, seed: int):
    rng = random.Random(seed)
    start = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    rows = []
    for t in range(turns):
        speaker = names[t % 2]
        other = names[(t + 1) % 2] or "friend"
        words = rng.choices(WORDS, k=rng.randint(3, 25))
        if rng.random() < 0.3:
            words.insert(0, f"Thanks, {other}!")
        if rng.random() < 0.1:
            words = [f"{other}!"]  # nothing left once the names are stripped
        rows.append(
            {
                "path": path,
                "turn_id": f"t{t}",
                "session_id": path.rsplit("/", 1)[-1].removesuffix(".jsonl"),
                "conversation_id": conversation,
                "role": "user" if t % 2 == 0 else "assistant",
                "speaker": speaker,
                "content": " ".join(words),
                "event_time": start + timedelta(minutes=t) if rng.random() < 0.8 else None,
                "line": t + 1,
            }
        )
    return rows


def episodes_and_files(sessions: int = 6) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    rows, files = [], []
    for s in range(sessions):
        conversation = f"conv-{s % 3}"
        path = f"sessions/{conversation}/s{s}.jsonl"
        rows += session_rows(path, conversation, NAMES[s % 3], turns=12 + s, seed=s)
        files.append(
            {
                "path": path,
                "kind": "transcript",
                "source": "sessions",
                "hash": f"h{s}",
                "conversation_id": conversation,
                "session_id": f"s{s}",
            }
        )
    schema = {
        "path": pl.String,
        "turn_id": pl.String,
        "session_id": pl.String,
        "conversation_id": pl.String,
        "role": pl.String,
        "speaker": pl.String,
        "content": pl.String,
        "event_time": pl.Datetime("us", "UTC"),
        "line": pl.Int32,
    }
    return pl.DataFrame(rows, schema=schema).sort("path", "line"), files


def by_id(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.drop_columns(["updated_at"]).to_pylist(), key=lambda row: row["id"])


def test_columnar_rows_equal_packed_rows() -> None:
    episodes, files = episodes_and_files()
    turns = _with_turn_columns(episodes)
    files_by_path = {f["path"]: f for f in files}

    columnar = _single_turn_rows(turns, files_by_path, NOW)
    packed = _packed_rows(turns, files_by_path, max_tokens=400, overlap=80, max_turns=1, now=NOW)

    assert columnar.schema == CHUNK_SCHEMA and packed.schema == CHUNK_SCHEMA
    assert columnar.num_rows == episodes.height
    assert by_id(columnar) == by_id(packed)
    rows = by_id(columnar)
    # What the comparison covers: names stripped, a turn emptied by it, role labels, times.
    assert any(row["text"].startswith("Caroline: ") for row in rows)
    assert any(row["text"].startswith("User: ") for row in rows)
    assert not any("Melanie" in row["search_text"] for row in rows)
    assert any(row["event_time"] is None for row in rows)


def test_search_text_is_previous_turn_then_this_one() -> None:
    episodes, files = episodes_and_files(sessions=1)
    table = transcript_chunk_rows(files, episodes, max_tokens=400, overlap=80, max_turns=1, now=NOW)
    rows = {row["turn_ids"][0]: row for row in table.to_pylist()}

    first, second = rows["t0"], rows["t1"]
    assert first["search_text"] in first["text"]
    assert second["search_text"].startswith(first["search_text"])
    assert second["id"] == chunk_id(files[0]["path"], "h0", 1)


def test_a_session_with_a_too_long_turn_is_packed() -> None:
    episodes, files = episodes_and_files(sessions=2)
    long_turn = " ".join(["pottery"] * 500)
    episodes = episodes.with_columns(
        content=pl.when((pl.col("path") == files[0]["path"]) & (pl.col("line") == 3))
        .then(pl.lit(long_turn))
        .otherwise(pl.col("content"))
    )

    table = transcript_chunk_rows(files, episodes, max_tokens=100, overlap=20, max_turns=1, now=NOW)
    rows = table.to_pylist()

    pieces = [r for r in rows if r["path"] == files[0]["path"] and r["turn_ids"] == ["t2"]]
    assert len(pieces) >= 4 and all(r["tokens"] <= 100 for r in pieces)
    other = [r for r in rows if r["path"] == files[1]["path"]]
    assert len(other) == episodes.filter(pl.col("path") == files[1]["path"]).height


@pytest.mark.parametrize("max_turns", [2, None])
def test_several_turns_a_chunk_are_packed(max_turns: int | None) -> None:
    episodes, files = episodes_and_files(sessions=2)

    table = transcript_chunk_rows(
        files, episodes, max_tokens=400, overlap=80, max_turns=max_turns, now=NOW
    )

    assert table.num_rows < episodes.height
    assert max(len(row["turn_ids"]) for row in table.to_pylist()) >= 2


def test_no_turns_no_rows() -> None:
    episodes, files = episodes_and_files(sessions=1)

    table = transcript_chunk_rows(
        files, episodes.clear(), max_tokens=400, overlap=80, max_turns=1, now=NOW
    )

    assert table.num_rows == 0 and table.schema == CHUNK_SCHEMA
