"""The delta overlay's columnar filter and BM25 give exactly what the per-row rules gave.

`passes` and `bm25_per_row` below are the per-row code the overlay used before it held its
rows column by column (issue 16); hypothesis draws rows, filters and queries and compares.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_dag.index.delta import Overlay
from memory_dag.index.overlay_columns import Postings, RowColumns
from memory_dag.index.search import SearchFilters
from memory_dag.index.text_index import K1, B, tokenize

# --------------------------------------------------------------------------- the old rules


def passes(row: Mapping[str, Any], filters: Any) -> bool:
    """The overlay's per-row filter before it was columnar (verbatim)."""
    if filters is None:
        return True
    if filters.conversation is not None and row["conversation_id"] != filters.conversation:
        return False
    if filters.session is not None and row["session_id"] != filters.session:
        return False
    for column in ("source", "kind", "role", "speaker", "category", "user_id", "agent_id"):
        wanted = getattr(filters, column)
        if wanted is not None:
            accepted = [wanted] if isinstance(wanted, str) else list(wanted)
            if row[column] not in accepted:
                return False
    if filters.kind is None and row["kind"] in (filters.exclude_kinds or ()):
        return False
    if filters.path is not None:
        path, prefix = row["path"] or "", filters.path
        if not (path == prefix or (prefix.endswith("/") and path.startswith(prefix))):
            return False
    importance = row["importance"] if row["importance"] is not None else -1
    if filters.importance_min is not None and importance < filters.importance_min:
        return False
    if filters.importance_max is not None and not 0 <= importance <= filters.importance_max:
        return False
    if filters.pinned is not None and bool(row["pinned"]) != filters.pinned:
        return False
    updated = _time(row["updated_at"])
    after, before = filters.updated_after, filters.updated_before
    if after is not None and (updated is None or updated < _aware(after)):
        return False
    return before is None or (updated is not None and updated < _aware(before))


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def bm25_per_row(
    query: str, terms: list[Counter[str]], text: Any, published_avg: float | None
) -> np.ndarray:
    """The overlay's BM25 before it kept postings (verbatim but for its inputs)."""
    scores = np.zeros(len(terms), dtype=np.float32)
    if not terms:
        return scores
    lengths = np.asarray([sum(t.values()) for t in terms], dtype=np.float32)
    total = text.size + len(terms)
    average = published_avg or float(lengths.mean() or 1.0)
    norm = K1 * (1.0 - B) + K1 * B * lengths / max(average, 1e-9)
    frequencies: Counter[str] = Counter()
    for counted in terms:
        frequencies.update(counted.keys())
    for term in tokenize(query):
        frequency = text.document_frequency(term) + frequencies[term]
        if not frequency:
            continue
        idf = np.log1p((total - frequency + 0.5) / (frequency + 0.5))
        tf = np.asarray([counted[term] for counted in terms], dtype=np.float32)
        scores += (idf * tf / (tf + norm)).astype(np.float32)
    return scores


# --------------------------------------------------------------------------- strategies

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MOMENTS = [T0 + timedelta(hours=h, microseconds=m) for h in range(4) for m in (0, 1)]
TEXT = {
    "conversation_id": ["c1", "c2", None],
    "session_id": ["s1", "s2", None],
    "source": ["memories", "sessions", "memory"],
    "kind": ["fact", "episode", "procedural", "summary"],
    "role": ["user", "assistant", None],
    "speaker": ["Ann", "ann", "Bob", None, ""],
    "category": ["profile", "goals", None],
    "user_id": ["u1", "u2", None],
    "agent_id": ["a1", "a2", None],
    "path": ["", None, "sessions/c1/s1.jsonl", "sessions/c1/", "sessions/c2/s2.jsonl", "notes"],
}

rows_st = st.lists(
    st.fixed_dictionaries(
        {
            **{name: st.sampled_from(values) for name, values in TEXT.items()},
            "importance": st.sampled_from([None, 0, 1, 3, 5, 10]),
            "pinned": st.sampled_from([None, False, True]),
            "updated_at": st.sampled_from([None, *MOMENTS, *(m.isoformat() for m in MOMENTS)]),
        }
    ),
    max_size=40,
)


def one_or_many(values: list[Any]) -> st.SearchStrategy[Any]:
    named = [v for v in values if v is not None]
    return st.none() | st.sampled_from(named) | st.lists(st.sampled_from(values), max_size=3)


FILTER_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "conversation": st.sampled_from(["c1", "c2", "c3"]),
    "session": st.sampled_from(["s1", "s2"]),
    "source": one_or_many(TEXT["source"]),
    "path": st.sampled_from(["", "sessions/c1/", "sessions/", "notes", "sessions"]),
    "kind": one_or_many(TEXT["kind"]),
    "role": one_or_many(TEXT["role"]),
    "speaker": one_or_many(TEXT["speaker"]),
    "category": one_or_many(TEXT["category"]),
    "user_id": one_or_many(TEXT["user_id"]),
    "agent_id": one_or_many(TEXT["agent_id"]),
    "importance_min": st.integers(-2, 11),
    "importance_max": st.integers(-2, 11),
    "pinned": st.booleans(),
    "updated_after": st.sampled_from(MOMENTS + [m.replace(tzinfo=None) for m in MOMENTS]),
    "updated_before": st.sampled_from(MOMENTS),
    "exclude_kinds": st.sampled_from([(), ("procedural",), ("procedural", "summary")]),
}


@st.composite
def filters_st(draw: st.DrawFn) -> SearchFilters:
    """Filters on a few columns at a time, so that some rows pass and some do not."""
    names = draw(st.lists(st.sampled_from(sorted(FILTER_FIELDS)), max_size=3, unique=True))
    return SearchFilters(**{name: draw(FILTER_FIELDS[name]) for name in names})


def columns_in_pieces(rows: list[dict[str, Any]], cuts: list[int]) -> RowColumns:
    """Columns extended piece by piece, as the overlay is extended by new delta records."""
    columns = RowColumns()
    start = 0
    for cut in sorted({min(c, len(rows)) for c in cuts} | {len(rows)}):
        columns = columns.extended(rows[start:cut])
        start = cut
    return columns


# --------------------------------------------------------------------------- the filter


@settings(max_examples=400, deadline=None)
@given(rows=rows_st, filters=st.none() | filters_st(), cuts=st.lists(st.integers(0, 40)))
def test_the_columnar_filter_keeps_the_rows_the_per_row_rule_kept(
    rows: list[dict[str, Any]], filters: SearchFilters | None, cuts: list[int]
) -> None:
    expected = [i for i, row in enumerate(rows) if passes(row, filters)]
    columns = columns_in_pieces(rows, cuts)
    kept = columns.allowed(filters)
    assert kept.dtype == np.int64
    assert kept.tolist() == expected
    for name in ("ann", "bob", ""):  # the speaker boost's rule, over the rows kept
        said = [(rows[i]["speaker"] or "").lower() == name for i in expected]
        assert columns.said_by(kept, name).tolist() == said


def test_the_filter_drops_exactly_the_rows_each_rule_names() -> None:
    """Fixed cases where each rule keeps a strict subset, so a wrong column shows."""
    rows = [
        {**{name: values[0] for name, values in TEXT.items()}, "importance": 3, "pinned": True,
         "updated_at": MOMENTS[2].isoformat()},
        {**{name: values[1] for name, values in TEXT.items()}, "importance": None, "pinned": None,
         "updated_at": None},
        {**{name: values[2] for name, values in TEXT.items()}, "importance": 0, "pinned": False,
         "updated_at": MOMENTS[5], "kind": "summary"},
    ]  # fmt: skip
    columns = RowColumns().extended(rows[:1]).extended(rows[1:])
    cases = [
        (SearchFilters(conversation="c2"), [1]),
        (SearchFilters(user_id=["u2", None]), [1, 2]),
        (SearchFilters(exclude_kinds=("summary",)), [0, 1]),
        (SearchFilters(kind="summary", exclude_kinds=("summary",)), [2]),
        (SearchFilters(speaker=""), []),
        (SearchFilters(path="sessions/c1/"), [2]),
        (SearchFilters(path=""), [0, 1]),  # a row without a path has path ""
        (SearchFilters(importance_min=0), [0, 2]),
        (SearchFilters(importance_max=2), [2]),
        (SearchFilters(pinned=False), [1, 2]),
        (SearchFilters(updated_after=MOMENTS[3]), [2]),
        (SearchFilters(updated_after=MOMENTS[2]), [0, 2]),  # at that very moment: kept
        (SearchFilters(updated_before=MOMENTS[5]), [0]),
    ]
    for filters, expected in cases:
        assert [i for i, row in enumerate(rows) if passes(row, filters)] == expected, filters
        assert columns.allowed(filters).tolist() == expected, filters


# --------------------------------------------------------------------------- bm25

WORDS = ["apple", "garden", "tomato", "running", "zebra", "peanut", "the", "xq"]


@dataclass
class FakeText:
    """The published version's term statistics, as `Overlay.bm25` reads them."""

    size: int
    avg_length: float | None
    frequency: dict[str, int]

    def document_frequency(self, term: str) -> int:
        return self.frequency.get(term, 0)


@settings(max_examples=300, deadline=None)
@given(
    documents=st.lists(st.lists(st.sampled_from(WORDS), max_size=12), max_size=30),
    query=st.lists(st.sampled_from([*WORDS, "absent"]), max_size=6).map(" ".join),
    published=st.integers(0, 1000),
    avg_length=st.none() | st.floats(0.5, 20),
    frequency=st.dictionaries(st.sampled_from(tokenize(" ".join(WORDS))), st.integers(0, 50)),
    cuts=st.lists(st.integers(0, 30)),
)
def test_bm25_from_postings_equals_the_per_row_scores(
    documents: list[list[str]],
    query: str,
    published: int,
    avg_length: float | None,
    frequency: dict[str, int],
    cuts: list[int],
) -> None:
    terms = [Counter(tokenize(" ".join(words))) for words in documents]
    text = FakeText(published, avg_length, frequency)
    postings, start = Postings(), 0
    for cut in sorted({min(c, len(terms)) for c in cuts} | {len(terms)}):
        postings, start = postings.extended(terms[start:cut]), cut
    overlay = Overlay(rows=[{} for _ in terms], _postings=postings)
    expected = bm25_per_row(query, terms, text, avg_length)
    scores = overlay.bm25(query, _Index(text))  # type: ignore[arg-type]
    assert scores.dtype == np.float32
    assert np.array_equal(scores, expected)  # bit for bit, not approximately
    for term in {t for counted in terms for t in counted}:
        assert postings.document_frequency(term) == sum(1 for c in terms if term in c)
        assert postings.term_frequency(term).tolist() == [c[term] for c in terms]


@dataclass
class _Index:
    text: FakeText


def test_bm25_scores_rows_holding_query_terms_and_only_them() -> None:
    terms = [Counter(tokenize(t)) for t in ("apple garden", "zebra", "apple apple tomato")]
    overlay = Overlay(rows=[{} for _ in terms], _postings=Postings().extended(terms))
    scores = overlay.bm25("apple", _Index(FakeText(10, 3.0, {})))  # type: ignore[arg-type]
    assert scores[1] == 0 and scores[2] > scores[0] > 0
    assert np.array_equal(scores, bm25_per_row("apple", terms, FakeText(10, 3.0, {}), 3.0))
