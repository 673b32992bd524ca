"""Search text: names stripped alike one text at a time (queries) and in bulk (ingest)."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest

from memory_dag.index.search_text import (
    bm25_documents,
    participant_names,
    strip_names,
    strip_names_many,
    transcript_search_text,
)

NAMES = participant_names(["Caroline", "Melanie Smith", "Jo", "Dr. O'Brien (PhD)"])
TEXTS = [
    "Thanks, Melanie! How was the trip, Caroline?",
    "caroline's dog and Melanie’s cat; CAROLINE agreed.",
    "Melanie Smith went to the lake with Smith's kids.",
    "Carolines is not a name here, nor is Melanies, but Jo is (a speaker's full name).",
    "Dr. O'Brien (PhD) said hello",
    "Caroline",
    "",
    "  spaces\tand\nnewlines  around Caroline  ",
    "Ünïcödé Melanie naïve café",
]


def test_participant_names_keep_full_and_first_names() -> None:
    assert "Melanie Smith" in NAMES and "Melanie" in NAMES
    assert "Al" not in participant_names(["Al Green"])  # first names under 3 letters are kept


@pytest.mark.parametrize("text", TEXTS)
def test_bulk_stripping_equals_one_at_a_time(text: str) -> None:
    assert strip_names_many([text], NAMES) == [strip_names(text, NAMES)]


def test_names_and_possessives_are_removed() -> None:
    stripped = strip_names_many(TEXTS[:2], NAMES)

    assert stripped == ["Thanks, ! How was the trip, ?", "dog and cat; agreed."]


def test_no_names_leaves_texts_alone() -> None:
    assert strip_names_many(["a  b"], []) == ["a  b"]
    assert strip_names("a  b", []) == "a  b"


def test_search_text_joins_previous_and_current_turn() -> None:
    assert transcript_search_text("A sunset.", "What did you paint?") == (
        "What did you paint? A sunset."
    )
    assert transcript_search_text("Hi", None) == "Hi"
    assert transcript_search_text("Hi", "") == "Hi"


def test_bm25_documents_put_the_date_before_dated_transcript_turns() -> None:
    rows = pl.DataFrame(
        {
            "search_text": ["a sunset", "no time", "a note", "late at night"],
            "event_time": [
                datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
                None,
                datetime(2023, 5, 8, tzinfo=UTC),
                datetime(2023, 12, 31, 23, 59, tzinfo=UTC),
            ],
            "kind": ["transcript", "transcript", "note", "transcript"],
        },
        schema_overrides={"event_time": pl.Datetime("us", "UTC")},
    )

    assert bm25_documents(rows).to_list() == [
        "[8 May 2023] a sunset",
        "no time",
        "a note",
        "[31 December 2023] late at night",
    ]
