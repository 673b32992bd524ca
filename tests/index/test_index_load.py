"""Loading a published version (`published.load_index`): its rows become Python values only
when read (`ColumnLists`), its codes and groups are made in Arrow, and all of it must be what
the plain Python over every row would give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_dag.index import published
from memory_dag.index.published import (
    CHUNK_KINDS,
    CODED_COLUMNS,
    ROW_SCHEMA,
    ColumnLists,
    load_index,
    publish_index,
    python_values,
)

_times = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
)
_row = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["transcript", "note", "entry", "fact", "summary"]),
        "source": st.sampled_from(["sessions", "memory", "derived"]),
        "path": st.one_of(st.none(), st.sampled_from(["a.jsonl", "b.jsonl", "n.md"])),
        "start_line": st.integers(0, 50),
        "end_line": st.integers(0, 50),
        "text": st.text(max_size=12),
        "search_text": st.text(max_size=12),
        "speaker": st.sampled_from([None, "", "Maria", "maria", "MARIA", "Σοφία", "İlker"]),
        "turn_ids": st.one_of(st.none(), st.lists(st.sampled_from(["t1", "t2", "t3"]))),
        "conversation_id": st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3"])),
        "session_id": st.one_of(st.none(), st.sampled_from(["s1", "s2"])),
        "event_time": _times,
        "role": st.sampled_from([None, "user", "assistant"]),
        "category": st.sampled_from([None, "personal", "work"]),
        "user_id": st.sampled_from([None, "u1", "u2"]),
        "agent_id": st.sampled_from([None, "a1"]),
        "importance": st.one_of(st.none(), st.integers(1, 10)),
        "pinned": st.one_of(st.none(), st.booleans()),
        "updated_at": _times,
    }
)


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    rows = [{"id": f"r{i}", **row} for i, row in enumerate(rows)]
    return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)


def _reference(values: dict[str, list[Any]]) -> dict[str, Any]:
    """What the loader used to compute, row by row in Python."""

    def codes(column: list[Any]) -> tuple[list[int], dict[Any, int]]:
        seen: dict[Any, int] = {}
        return [seen.setdefault(v, len(seen)) for v in column], seen

    def groups(column: list[Any]) -> dict[Any, list[int]]:
        out: dict[Any, list[int]] = {}
        for row, value in enumerate(column):
            out.setdefault(value, []).append(row)
        return out

    file_or_memory = [
        path if kind in CHUNK_KINDS else f"{kind}:{row_id}"
        for path, kind, row_id in zip(values["path"], values["kind"], values["id"], strict=True)
    ]
    speakers = sorted({s.lower() for s in values["speaker"] if s})
    return {
        "codes": {column: codes(values[column]) for column in CODED_COLUMNS},
        "same_file_as_previous": [
            a == b for a, b in zip(file_or_memory[1:], file_or_memory[:-1], strict=True)
        ],
        "speakers": speakers,
        "speaker_code": [speakers.index(s.lower()) if s else -1 for s in values["speaker"]],
        "by_conversation": groups(values["conversation_id"]),
        "by_session": groups(values["session_id"]),
    }


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(_row, min_size=1, max_size=25))
def test_a_loaded_version_is_what_python_over_every_row_gives(
    rows: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("index")
    table = _table(rows)
    vectors = np.random.default_rng(0).normal(size=(table.num_rows, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    publish_index(folder, table, vectors, provider="p", model="m", fingerprint="f")
    index = load_index(folder)
    expected = {name: table.column(name).to_pylist() for name in ROW_SCHEMA.names}
    reference = _reference(expected)

    for name in ROW_SCHEMA.names:  # search_text included: it is read from the file on demand
        assert index.rows[name] == expected[name], name
    for column in CODED_COLUMNS:
        codes, lookup = index.codes[column]
        want_codes, want_lookup = reference["codes"][column]
        assert lookup == want_lookup and codes.tolist() == want_codes, column
    same = (index.path_code[1:] == index.path_code[:-1]).tolist()
    assert same == reference["same_file_as_previous"]
    assert index.prev_row.tolist() == [-1] + [r if s else -1 for r, s in enumerate(same)]
    assert index.speakers == reference["speakers"]
    assert index.speaker_code.tolist() == reference["speaker_code"]
    for groups, want in (
        (index.rows_by_conversation, reference["by_conversation"]),
        (index.rows_by_session, reference["by_session"]),
    ):
        assert list(groups) == list(want)
        assert {k: v.tolist() for k, v in groups.items()} == want


def test_times_are_arrows_datetimes_made_faster() -> None:
    moments = [
        datetime(2026, 11, 29, 16, 11, 23, 317630, tzinfo=UTC),
        None,
        datetime(1, 1, 2, tzinfo=UTC),
        datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
    ]
    column = pa.chunked_array([pa.array(moments, pa.timestamp("us", tz="UTC"))])
    values = python_values(column)
    assert values == column.to_pylist()
    # The same time zone object Arrow gives, so the values print and compare alike.
    assert [type(v.tzinfo) for v in values if v] == [
        type(v.tzinfo) for v in column.to_pylist() if v
    ]
    assert [v.isoformat() for v in values if v] == [v.isoformat() for v in moments if v]
    # Other units and zones go through Arrow's own conversion.
    other = pa.array(
        [datetime(2020, 1, 1, tzinfo=timezone(timedelta(hours=2)))], pa.timestamp("s", tz="+02:00")
    )
    assert python_values(other) == other.to_pylist()


def test_rows_taken_one_by_one_are_the_columns_values(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    rows = [
        {
            "kind": "transcript",
            "text": f"text {i}",
            "turn_ids": [f"t{i}"] if i % 3 else None,
            "event_time": datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=i)
            if i % 4
            else None,
            "speaker": ["Maria", None, ""][i % 3],
        }
        for i in range(100)
    ]
    whole = _table(rows)
    # Several chunks, as a version read from its row groups: Arrow's own take joins them.
    chunked = pa.Table.from_batches(whole.to_batches(max_chunksize=17))
    assert chunked.column("text").num_chunks > 1
    names = ("id", "text", "turn_ids", "event_time", "speaker")
    expected = {name: whole.column(name).to_pylist() for name in names}
    monkeypatch.setattr(published, "LISTS_AFTER_ROWS", 150)
    columns = ColumnLists(chunked)
    for _ in range(3):  # any order, repeats, across chunk boundaries
        positions = rng.integers(0, 100, size=40).tolist()
        taken = columns.take(positions, names)
        assert taken == [{n: expected[n][p] for n in names} for p in positions]
    # 120 rows read one by one so far: the columns are still Arrow's.
    assert not any(name in columns._lists for name in names)
    columns.take([99, 0, 50], names)
    columns.take(list(range(40)), names)  # past LISTS_AFTER_ROWS: now lists
    assert all(name in columns._lists for name in names)
    assert columns.take([5, 5, 98], names) == [
        {n: expected[n][p] for n in names} for p in (5, 5, 98)
    ]
    assert columns.take([], names) == []
