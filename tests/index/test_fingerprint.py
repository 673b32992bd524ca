"""The index step's fingerprints (`build.rows_fingerprint`): what decides whether the search
index and DuckDB's FTS index are made again. Order must not matter; any pair that changes must."""

from __future__ import annotations

import random

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_dag.index.build import rows_fingerprint

#: Ids as the store's (`ch_...`, `conv-1:summary:L1:0`), hashes hex.
_pairs = st.dictionaries(
    st.text(alphabet="abc_-:0123456789", min_size=1, max_size=6),
    st.text(alphabet="0123456789abcdef", max_size=6),
    max_size=30,
)


def fingerprint(pairs: list[tuple[str, str]]) -> str:
    con = duckdb.connect()
    con.execute("CREATE TABLE chunks (id TEXT PRIMARY KEY, hash TEXT NOT NULL)")
    if pairs:
        con.executemany("INSERT INTO chunks VALUES (?, ?)", pairs)
    return rows_fingerprint(con, "chunks")


@settings(max_examples=60, deadline=None)
@given(pairs=_pairs, seed=st.integers(0, 1000))
def test_the_same_pairs_in_any_order_give_the_same_fingerprint(
    pairs: dict[str, str], seed: int
) -> None:
    shuffled = list(pairs.items())
    random.Random(seed).shuffle(shuffled)
    assert fingerprint(shuffled) == fingerprint(sorted(pairs.items()))


@settings(max_examples=60, deadline=None)
@given(pairs=_pairs, data=st.data())
def test_a_pair_added_removed_or_changed_gives_another_fingerprint(
    pairs: dict[str, str], data: st.DataObject
) -> None:
    before = fingerprint(list(pairs.items()))
    changed = dict(pairs)
    if pairs and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(pairs)))
        if data.draw(st.booleans()):
            del changed[key]  # removed
        else:
            changed[key] = pairs[key] + "x"  # its content changed
    else:
        changed[data.draw(st.text(alphabet="XYZ", min_size=1, max_size=4))] = "new"  # added
    assert fingerprint(list(changed.items())) != before


def test_only_the_index_steps_relations_are_read() -> None:
    with pytest.raises(ValueError, match="no fingerprint"):
        rows_fingerprint(duckdb.connect(), "chunks; DROP TABLE chunks")
