"""Columnar views of the delta overlay's rows, so a search filters and scores them in numpy.

A search filters every delta row and scores every one with BM25; done row by row in Python
that cost ~8 ms a search at ~1.6k delta rows (issue 16). These structures hold the same facts
as the rows, column by column, and are extended (never changed) as the overlay is: an overlay
is shared by readers in other threads while a newer one is built from it.

`RowColumns.allowed` keeps exactly the rows the per-row rule kept (`SearchFilters`, as
`search.allowed_rows` reads them for the published version); `Postings.bm25` gives exactly
the scores the per-row loop gave (the same float32 arithmetic per row, rows without the term
left at zero).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

#: Text columns a filter compares by equality (one value or a list of accepted values).
EQUALITY_COLUMNS = ("source", "kind", "role", "speaker", "category", "user_id", "agent_id")
#: Every text column held as codes: the equality ones, the scope ones and the path.
CODED_COLUMNS = ("conversation_id", "session_id", *EQUALITY_COLUMNS, "path")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def epoch_us(moment: datetime) -> int:
    """Exact microseconds since the epoch (a naive time is UTC), so integer comparison orders
    as datetime comparison does."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


@dataclass(frozen=True)
class _Coded:
    """One text column as small integer codes; `lookup` maps a value (None too) to its code.
    Shared by the overlays extended from one another: codes only ever get added."""

    codes: np.ndarray
    lookup: dict[Any, int]

    def extended(self, values: Sequence[Any]) -> _Coded:
        lookup = dict(self.lookup)
        fresh = np.fromiter(
            (lookup.setdefault(v, len(lookup)) for v in values), dtype=np.int32, count=len(values)
        )
        return _Coded(np.concatenate([self.codes, fresh]), lookup)

    def isin(self, accepted: Sequence[Any]) -> np.ndarray:
        """Mask of the rows whose value is one of `accepted` (`value in accepted`)."""
        codes = [self.lookup[v] for v in accepted if v in self.lookup]
        if len(codes) == 1:
            return self.codes == codes[0]
        return np.isin(self.codes, codes)

    def where(self, predicate: Any) -> np.ndarray:
        """Mask of the rows whose value satisfies `predicate` (called once per distinct value)."""
        return np.isin(self.codes, [code for v, code in self.lookup.items() if predicate(v)])


def _empty_coded() -> dict[str, _Coded]:
    return {name: _Coded(np.zeros(0, np.int32), {}) for name in CODED_COLUMNS}


@dataclass(frozen=True)
class RowColumns:
    """The filter columns of the overlay's rows, in row order."""

    coded: dict[str, _Coded] = field(default_factory=_empty_coded)
    #: Importance, -1 where the row has none.
    importance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    pinned: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: `updated_at` in microseconds since the epoch; `has_updated` is False where it is None.
    updated_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    has_updated: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.pinned)

    def extended(self, rows: Sequence[Mapping[str, Any]]) -> RowColumns:
        """These columns with `rows` appended (a new object; this one is left as it was)."""
        if not rows:
            return self
        times = [_time(row["updated_at"]) for row in rows]
        importance = [row["importance"] if row["importance"] is not None else -1 for row in rows]
        return RowColumns(
            coded={
                name: column.extended([row[name] for row in rows])
                for name, column in self.coded.items()
            },
            importance=np.concatenate([self.importance, np.asarray(importance, np.float64)]),
            pinned=np.concatenate([self.pinned, np.asarray([bool(r["pinned"]) for r in rows])]),
            updated_us=np.concatenate(
                [self.updated_us, np.asarray([epoch_us(t) if t else 0 for t in times], np.int64)]
            ),
            has_updated=np.concatenate(
                [self.has_updated, np.asarray([t is not None for t in times], bool)]
            ),
        )

    def allowed(self, filters: Any) -> np.ndarray:
        """Positions of the rows that pass `SearchFilters` (None: every row), ascending."""
        size = len(self)
        if filters is None:
            return np.arange(size, dtype=np.int64)
        mask = np.ones(size, dtype=bool)
        coded = self.coded
        if filters.conversation is not None:
            mask &= coded["conversation_id"].isin([filters.conversation])
        if filters.session is not None:
            mask &= coded["session_id"].isin([filters.session])
        for column in EQUALITY_COLUMNS:
            wanted = getattr(filters, column)
            if wanted is not None:
                mask &= coded[column].isin([wanted] if isinstance(wanted, str) else list(wanted))
        if filters.kind is None and filters.exclude_kinds:
            mask &= ~coded["kind"].isin(list(filters.exclude_kinds))
        if filters.path is not None:
            prefix = filters.path
            mask &= coded["path"].where(
                lambda path: (
                    (path or "") == prefix
                    or (prefix.endswith("/") and (path or "").startswith(prefix))
                )
            )
        if filters.importance_min is not None:
            mask &= self.importance >= filters.importance_min
        if filters.importance_max is not None:
            mask &= (self.importance >= 0) & (self.importance <= filters.importance_max)
        if filters.pinned is not None:
            mask &= self.pinned == filters.pinned
        if filters.updated_after is not None:
            mask &= self.has_updated & (self.updated_us >= epoch_us(filters.updated_after))
        if filters.updated_before is not None:
            mask &= self.has_updated & (self.updated_us < epoch_us(filters.updated_before))
        return np.flatnonzero(mask).astype(np.int64, copy=False)

    def said_by(self, positions: np.ndarray, name: str) -> np.ndarray:
        """Mask over `positions`: rows whose speaker, lower-cased, is `name`."""
        speaker = self.coded["speaker"]
        mask = speaker.where(lambda value: (value or "").lower() == name)
        return mask[positions]


@dataclass(frozen=True)
class Postings:
    """The BM25 term x row matrix of the overlay's rows, by term: the rows holding it (in row
    order) and how often; plus every row's length in terms."""

    by_term: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def __len__(self) -> int:
        return len(self.lengths)

    def document_frequency(self, term: str) -> int:
        held = self.by_term.get(term)
        return 0 if held is None else len(held[0])

    def extended(self, terms: Sequence[Counter[str]]) -> Postings:
        """These postings with rows of `terms` appended (a new object)."""
        if not terms:
            return self
        start = len(self.lengths)
        fresh: dict[str, tuple[list[int], list[int]]] = {}
        for offset, counted in enumerate(terms):
            for term, count in counted.items():
                rows, counts = fresh.setdefault(term, ([], []))
                rows.append(start + offset)
                counts.append(count)
        by_term = dict(self.by_term)
        for term, (rows, counts) in fresh.items():
            new = (np.asarray(rows, np.int64), np.asarray(counts, np.float32))
            old = by_term.get(term)
            by_term[term] = (
                new
                if old is None
                else (np.concatenate([old[0], new[0]]), np.concatenate([old[1], new[1]]))
            )
        lengths = np.asarray([sum(t.values()) for t in terms], dtype=np.float32)
        return Postings(by_term, np.concatenate([self.lengths, lengths]))

    def term_frequency(self, term: str) -> np.ndarray:
        """How often `term` occurs in every row (float32; for tests and the reference loop)."""
        tf = np.zeros(len(self.lengths), np.float32)
        held = self.by_term.get(term)
        if held is not None:
            tf[held[0]] = held[1]
        return tf
