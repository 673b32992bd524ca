"""The reader's overlay of the delta segment is extended by the records appended since it was
built, and answers exactly as one built from scratch: same fields, same hits, same scores; a
rewritten file or a new published version makes it start again from the file as it stands."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from memory_dag import Memory
from memory_dag.config import Settings
from memory_dag.index import delta
from memory_dag.index.delta import Overlay, build_overlay, delta_file, delta_path
from memory_dag.index.search import Searcher, get_searcher
from memory_dag.pipeline import run_all

USER = "sam"
QUERIES = ("peanut allergy", "deploy pipeline Fridays", "tea", "code word", "watering tomatoes")


@pytest.fixture
def memory(settings: Settings) -> Memory:
    run_all(settings)  # a published version with rows the delta can hide
    return Memory(settings)


def from_scratch(searcher: Searcher) -> Overlay:
    records = delta_file(searcher.index_dir).snapshot()[1]
    return build_overlay(searcher.index, records, searcher._embed_documents)


def assert_same(extended: Overlay, scratch: Overlay) -> None:
    assert extended.rows == scratch.rows
    assert np.array_equal(extended.vectors, scratch.vectors)
    assert extended.vectors.dtype == scratch.vectors.dtype
    for name in ("memories", "hidden", "dead", "alive", "superseded", "released", "facts_of"):
        assert getattr(extended, name) == getattr(scratch, name), name
    assert list(extended.memories) == list(scratch.memories)  # the same order too
    assert extended.changes == scratch.changes
    assert (extended.seq, extended.users, extended.kinds) == (
        scratch.seq,
        scratch.users,
        scratch.kinds,
    )
    assert np.array_equal(extended.hidden_rows, scratch.hidden_rows)
    assert extended._postings.by_term.keys() == scratch._postings.by_term.keys()
    for term, (rows, counts) in scratch._postings.by_term.items():
        assert np.array_equal(extended._postings.by_term[term][0], rows), term
        assert np.array_equal(extended._postings.by_term[term][1], counts), term
    assert np.array_equal(extended._postings.lengths, scratch._postings.lengths)
    for name in scratch._columns.coded:
        values = [row[name] for row in scratch.rows]
        mine = extended._columns.coded[name]
        inverse = {code: value for value, code in mine.lookup.items()}
        assert [inverse[int(c)] for c in mine.codes] == values, name
    for name in ("importance", "pinned", "updated_us", "has_updated"):
        assert np.array_equal(getattr(extended._columns, name), getattr(scratch._columns, name))


def answers(memory: Memory) -> list[list[tuple[str, float]]]:
    return [
        [(hit.id, hit.score) for hit in memory.search(q, user_id=USER, min_score=0.0).results]
        for q in QUERIES
    ]


def answers_from_scratch(memory: Memory) -> list[list[tuple[str, float]]]:
    delta._overlays.clear()  # the process forgets its overlay: the next search builds one anew
    return answers(memory)


def test_an_extended_overlay_answers_like_one_built_from_scratch(memory: Memory) -> None:
    searcher = get_searcher(memory.settings)
    memory.add("Sam is allergic to peanuts", user_id=USER, category="profile")
    memory.add([{"role": "user", "content": "My code word is banana."}], user_id=USER)
    before = searcher.overlay()
    assert len(before) >= 2

    # Appends that lay new memories: the overlay is extended (its rows are shared, not rebuilt).
    memory.add("Sam drinks green tea every morning", user_id=USER, category="preferences")
    for n in range(3):
        said = [{"role": "user", "content": f"My new code word is kiwi{n}, number {n}."}]
        memory.add(said, user_id=USER, conversation_id="chat")
    extended = searcher.overlay()
    assert len(extended) > len(before)
    assert extended.rows[0] is before.rows[0]
    assert len(before) == len(before.rows) == before.vectors.shape[0]  # the old one unchanged
    assert_same(extended, from_scratch(searcher))
    incremental = answers(memory)
    assert any(hits for hits in incremental)
    assert incremental == answers_from_scratch(memory)

    # An append that changes a memory the overlay already laid (a delta fact updated, one
    # deleted): the overlay is rebuilt, and still the same as from scratch.
    tea = memory.search("green tea", user_id=USER).results[0].id
    memory.update(tea, "Sam drinks black tea every morning", user_id=USER)
    allergy = memory.search("peanut allergy", user_id=USER).results[0].id
    memory.delete(allergy, user_id=USER)
    changed = searcher.overlay()
    assert_same(changed, from_scratch(searcher))
    assert answers(memory) == answers_from_scratch(memory)
    assert [hit.memory for hit in memory.search("tea", user_id=USER).results] == [
        "Sam drinks black tea every morning"
    ]


def test_a_rewritten_delta_or_a_new_version_is_read_again_from_scratch(memory: Memory) -> None:
    searcher = get_searcher(memory.settings)
    for text, category in (
        ("Sam's locker number is 111", "profile"),
        ("Sam collects vintage stamps", "interests"),
        ("Sam wants to run a marathon", "goals"),
        ("Sam is building a treehouse", "projects"),
    ):
        memory.add(text, user_id=USER, category=category)
    first = searcher.overlay()
    path = delta_path(Path(memory.settings.index_dir))
    lines = path.read_bytes().splitlines(keepends=True)

    # Rewritten as `compact` does (a new file renamed over it) without its first record.
    staging = path.with_name("rewrite.tmp")
    staging.write_bytes(b"".join(lines[1:]))
    os.replace(staging, path)
    rewritten = searcher.overlay()
    assert len(rewritten) == len(first) - 1 and rewritten.rows[0] is not first.rows[0]
    assert_same(rewritten, from_scratch(searcher))
    assert answers(memory) == answers_from_scratch(memory)

    # Rewritten in place, shorter (same inode, the size shrinks): read again too.
    searcher.overlay()
    with open(path, "r+b") as handle:
        handle.truncate(0)
        handle.write(b"".join(lines[2:]))
    shrunk = searcher.overlay()
    assert len(shrunk) == len(first) - 2
    assert_same(shrunk, from_scratch(searcher))

    # Then appended to again: extended from the re-read state, still exact.
    memory.add("Sam's bike is red", user_id=USER, category="profile")
    grown = searcher.overlay()
    assert len(grown) == len(shrunk) + 1 and grown.rows[0] is shrunk.rows[0]
    assert_same(grown, from_scratch(searcher))

    # A new published version holds what the delta said: the new searcher's overlay is built
    # over it (not extended from the old version's), and lays nothing the version holds.
    run_all(memory.settings)
    newer = get_searcher(memory.settings)
    assert newer.index.folder.name != searcher.index.folder.name
    assert_same(newer.overlay(), from_scratch(newer))
    assert len(newer.overlay()) == 0
    assert memory.search("bike", user_id=USER).results[0].memory == "Sam's bike is red"


def test_forgetting_a_published_fact_drawn_from_a_turn_extends_the_overlay(
    memory: Memory,
) -> None:
    said = [{"role": "user", "content": "I am vegetarian and my sister Priya lives in Toronto."}]
    learned = [e for e in memory.add(said, user_id=USER, conversation_id="chat").results]
    assert learned, "the rules extract a fact from the turn"
    run_all(memory.settings)  # the fact and its turn are in the published version now
    searcher = get_searcher(memory.settings)
    memory.add("Sam collects vintage stamps", user_id=USER, category="interests")
    before = searcher.overlay()

    memory.delete(learned[0].id, user_id=USER)  # a memory this overlay never laid
    extended = searcher.overlay()
    assert extended.rows and extended.rows[0] is before.rows[0]
    assert learned[0].id in extended.dead and extended.superseded
    assert_same(extended, from_scratch(searcher))
    assert answers(memory) == answers_from_scratch(memory)


def test_refresh_lays_the_new_writes_before_the_next_read(memory: Memory) -> None:
    searcher = get_searcher(memory.settings)
    memory.search("warm up", user_id=USER)
    memory.add([{"role": "user", "content": "My code word is mango."}], user_id=USER)
    folder = str(Path(memory.settings.index_dir).resolve())
    stale = delta._overlays[folder].overlay
    assert not any("mango" in row["text"] for row in stale.rows)
    memory.refresh(user_id=USER)
    laid = delta._overlays[folder].overlay
    assert any("mango" in row["text"] for row in laid.rows)
    assert searcher.overlay() is laid  # the read finds it laid: nothing left to extend
    assert_same(laid, from_scratch(searcher))
