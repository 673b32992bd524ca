"""Hybrid search over the published index: vector + BM25 candidates, fused, filtered, ranked.

The read path never opens the DuckDB file: it reads the last published index version
(`published.py`), so a search during a running pipeline neither waits nor fails.

Why one module of ~650 lines: `Searcher` is the hot path; its candidate, fusion and boost stages
share its cached arrays and stay beside it so a search reads top to bottom (the later read
stages are in `read/`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.index.delta import Overlay, current_overlay, delta_path
from memory_dag.index.published import (
    IndexNotBuiltError,
    PublishedIndex,
    cached_index,
    empty_index,
    row_values,
)
from memory_dag.index.search_text import names_in, participant_names, strip_names
from memory_dag.index.vector_index import search_faiss
from memory_dag.paths import resolved
from memory_dag.scope import Scope

Fusion = Literal["zscore", "blend", "rrf"]
SNIPPET_CHARS = 700
#: The published row columns a hit carries (`_hit_of`).
_HIT_COLUMNS = (
    "id", "kind", "source", "path", "start_line", "end_line", "text", "conversation_id",
    "session_id", "turn_ids", "event_time", "role", "speaker", "category", "user_id",
    "agent_id", "importance",
)  # fmt: skip
RRF_K = 60
#: Scopes up to this many rows are scored exactly, row by row (a conversation always is).
EXACT_SCOPE_ROWS = 20_000
#: A z-fused score s is shown as sigmoid(s / ZSCORE_SCALE): 0.5 for an average row, ~0.73 for
#: one 4 standard deviations above it. `min_score` compares against this number.
ZSCORE_SCALE = 4.0
#: Rows sampled for the cosine mean and spread of a larger scope.
STATS_SAMPLE_ROWS = 4_096
#: Queries whose BM25 scores and vector a searcher keeps (`Searcher._query_signals`).
QUERY_CACHE = 8


@dataclass
class SearchHit:
    """One result: a chunk of a note or transcript, with where it came from."""

    id: str
    kind: str
    source: str
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    conversation_id: str | None
    session_id: str | None
    turn_ids: list[str] = field(default_factory=list)
    event_time: datetime | None = None
    vector_score: float = 0.0
    text_score: float = 0.0
    role: str | None = None
    speaker: str | None = None
    category: str | None = None
    user_id: str | None = None
    agent_id: str | None = None
    importance: int | None = None
    #: Row of the published index (vectors, neighbours); not stable across index versions.
    row: int = -1
    #: A row of the delta segment (a live write the published version lacks): text and vector.
    live: LiveRow | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "live"}
        data["turn_ids"] = list(self.turn_ids)
        data["event_time"] = self.event_time.isoformat() if self.event_time else None
        return data


@dataclass(frozen=True)
class LiveRow:
    """What a hit from the delta segment carries that the published arrays would hold."""

    text: str
    vector: np.ndarray


@dataclass
class SearchFilters:
    """Restrictions applied to the index rows before anything is ranked.

    A text filter takes one value or a list of accepted values. Chunks of notes and
    transcripts have no category, user, agent, importance or pin: a filter on those
    columns keeps only the memories that have them.
    """

    conversation: str | None = None
    session: str | None = None
    source: str | list[str] | None = None  # memory | sessions | memories
    path: str | None = None  # exact path, or a folder prefix ending in "/"
    kind: str | list[str] | None = None  # note | entry | transcript | fact | summary | ...
    role: str | list[str] | None = None
    speaker: str | list[str] | None = None
    category: str | list[str] | None = None
    user_id: str | list[str] | None = None
    agent_id: str | list[str] | None = None
    importance_min: int | None = None
    importance_max: int | None = None
    pinned: bool | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    #: Kinds left out unless `kind` asks for them: procedural memories are execution hints
    #: for the agents that request them (seed 003 §12), not conversational context.
    exclude_kinds: tuple[str, ...] = ("procedural",)


_EQUALITY_FILTERS = ("source", "kind", "role", "speaker", "category", "user_id", "agent_id")


def _epoch_us(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1_000_000)


def allowed_rows(index: PublishedIndex, filters: SearchFilters) -> np.ndarray | None:
    """Row numbers that pass the filters (None = every row), computed before ranking."""
    rows: np.ndarray | None = None
    if filters.conversation is not None:
        rows = index.rows_by_conversation.get(filters.conversation, np.zeros(0, np.int64))
    if filters.session is not None:
        session_rows = index.rows_by_session.get(filters.session, np.zeros(0, np.int64))
        rows = session_rows if rows is None else np.intersect1d(rows, session_rows)

    def keep(mask_of: Any) -> None:
        nonlocal rows
        candidates = np.arange(index.size) if rows is None else rows
        rows = candidates[mask_of(candidates)]

    for column in _EQUALITY_FILTERS:
        wanted = getattr(filters, column)
        if wanted is None:
            continue
        codes, lookup = index.codes[column]
        accepted = [
            lookup[v] for v in ([wanted] if isinstance(wanted, str) else wanted) if v in lookup
        ]
        keep(lambda r, codes=codes, accepted=accepted: np.isin(codes[r], accepted))
    if filters.kind is None and filters.exclude_kinds:
        codes, lookup = index.codes["kind"]
        excluded = [lookup[k] for k in filters.exclude_kinds if k in lookup]
        if excluded:
            keep(lambda r: ~np.isin(codes[r], excluded))
    if filters.path is not None:
        codes, lookup = index.codes["path"]
        prefix = filters.path
        accepted = [
            code
            for path, code in lookup.items()
            if path == prefix or (prefix.endswith("/") and str(path).startswith(prefix))
        ]
        keep(lambda r: np.isin(codes[r], accepted))
    if filters.importance_min is not None:
        keep(lambda r: index.importance[r] >= filters.importance_min)
    if filters.importance_max is not None:
        keep(lambda r: (index.importance[r] >= 0) & (index.importance[r] <= filters.importance_max))
    if filters.pinned is not None:
        keep(lambda r: index.pinned[r] == filters.pinned)
    if filters.updated_after is not None:
        after = _epoch_us(filters.updated_after)
        keep(lambda r: index.updated_us[r] >= after)
    if filters.updated_before is not None:
        before = _epoch_us(filters.updated_before)
        keep(lambda r: (index.updated_us[r] >= 0) & (index.updated_us[r] < before))
    return rows


def _scored_block(scope: np.ndarray | None) -> tuple[int, int] | None:
    """(first, last) when a scope is one block of rows scored exactly (a conversation), else
    None. Such a search reads BM25 scores of its own rows only: its pool is the scope itself
    (`EXACT_SCOPE_ROWS`), with no neighbours from outside."""
    if scope is None or len(scope) == 0 or len(scope) > EXACT_SCOPE_ROWS:
        return None
    first, last = int(scope[0]), int(scope[-1])
    return (first, last) if last - first + 1 == len(scope) else None


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep `value` under `key`, dropping the oldest entries beyond `QUERY_CACHE`."""
    cache.pop(key, None)
    while len(cache) >= QUERY_CACHE:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _top(scores: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` highest scores, best first."""
    if count >= len(scores):
        return np.argsort(-scores, kind="stable")
    part = np.argpartition(-scores, count)[:count]
    return part[np.argsort(-scores[part], kind="stable")]


class Searcher:
    """Holds the loaded index and embedding model; `search` is the hot path."""

    def __init__(self, settings: Settings, index: PublishedIndex | None = None) -> None:
        self.settings = settings
        self.index_dir = Path(settings.index_dir)
        self.index = index if index is not None else live_index(settings)
        manifest = self.index.manifest
        # Queries must be embedded by the model that built the index, whatever the settings say.
        query_settings = settings.model_copy(
            update={
                "embedding_provider": manifest["provider"],
                "embedding_model": manifest["model"],
            }
        )
        self.provider = get_provider(query_settings) if manifest["dims"] else None
        sample = np.random.default_rng(0).permutation(self.index.size)[:STATS_SAMPLE_ROWS]
        self._stats_sample = np.sort(sample)
        #: The rows of an unscoped search, made once (8 MB at 1M rows).
        self._every_row = np.arange(self.index.size)
        self._every_row.setflags(write=False)
        self._sample_vectors = np.asarray(self.index.vectors[self._stats_sample])
        self._speakers_by_scope: dict[object, np.ndarray] = {}
        self._bm25_cache: dict[tuple[str, tuple[int, int] | None], np.ndarray] = {}
        self._vector_cache: dict[str, np.ndarray | None] = {}
        self._query_lock = threading.Lock()

    def search(
        self,
        query: str,
        *,
        k: int | None = None,
        filters: SearchFilters | None = None,
        min_score: float | None = None,
        fusion: Fusion | None = None,
    ) -> list[SearchHit]:
        settings = self.settings
        k = settings.max_results if k is None else k
        min_score = settings.min_score if min_score is None else min_score
        fusion = fusion or settings.fusion
        index = self.index
        filters = filters or SearchFilters()
        overlay = self.overlay()
        scope = allowed_rows(index, filters)
        if scope is not None and len(overlay.hidden_rows):
            scope = np.setdiff1d(scope, overlay.hidden_rows, assume_unique=True)
        live = overlay.allowed(filters)
        published = index.size > 0 and (scope is None or len(scope) > 0)
        if k <= 0 or (not published and len(live) == 0):
            return []
        scope_rows = self._every_row if scope is None else scope

        query_text, named_speaker = self._speaker_aware_query(
            query, scope_rows, self._scope_key(filters, scope)
        )
        bm25_all, query_vector = self._query_signals(query_text, _scored_block(scope))
        live_bm25 = overlay.bm25(query_text, index)[live]
        live_cosine = (
            overlay.vectors[live] @ query_vector
            if query_vector is not None and len(live)
            else np.zeros(len(live), dtype=np.float32)
        )

        pool = np.zeros(0, np.int64)
        cosine = bm25 = scores = np.zeros(0, dtype=np.float32)
        if fusion == "zscore":
            if published:
                pool, cosine, fuse = self._zscore(scope, scope_rows, bm25_all, query_vector, k)
                pool, cosine = self._visible(pool, cosine, overlay.hidden_rows, scope)
                scores = self._context_boosts(pool, fuse(bm25_all[pool], cosine), named_speaker)
            else:
                fuse = self._fusion(live_bm25, live_cosine, query_vector)
            live_scores = fuse(live_bm25, live_cosine) + self._live_speaker_boost(
                overlay, live, named_speaker
            )
            fused = np.concatenate([scores, live_scores])
            final = 1.0 / (1.0 + np.exp(-fused / ZSCORE_SCALE))
            bm25 = np.concatenate([bm25_all[pool], live_bm25])
            cosine = np.concatenate([cosine, live_cosine])
        else:
            if published:
                pool = self._candidates(scope, scope_rows, bm25_all, query_vector, k)
                pool, _ = self._visible(pool, pool, overlay.hidden_rows, scope)
            cosine = np.concatenate([self._cosine(pool, query_vector), live_cosine])
            bm25 = np.concatenate([bm25_all[pool], live_bm25])
            if fusion == "rrf":
                final = _rrf(cosine, bm25, settings.vector_weight, settings.text_weight)
            else:
                final = _blend(cosine, bm25, settings, query_vector is not None)
        if len(final) == 0:
            return []

        best_bm25 = float(bm25.max()) if len(bm25) else 0.0
        text_norm = bm25 / best_bm25 if best_bm25 > 0 else np.zeros_like(bm25)
        chosen: list[tuple[int, tuple[float, float, float]]] = []
        for position in _top(final, min(len(final), k)):
            score = float(final[position])
            if score < min_score:
                break
            chosen.append((int(position), (score, cosine[position], text_norm[position])))
        # The published hits' values in one read (`ColumnLists.take`), then every hit in order.
        published = [int(pool[p]) for p, _ in chosen if p < len(pool)]
        values = iter(row_values(self.index.rows, published, _HIT_COLUMNS))
        hits: list[SearchHit] = []
        for position, signals in chosen:
            if position < len(pool):
                hits.append(_hit_of(next(values), *signals, row=int(pool[position])))
            else:
                hits.append(_live_hit(overlay, int(live[position - len(pool)]), *signals))
        return hits

    def _query_signals(
        self, query_text: str, block: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """BM25 of the published rows and the query's vector, kept for the last few queries:
        a context block searches twice with one query (its memories, then the always-shown
        categories), a caller often repeats one. Read-only, so no search can change them.

        `block` (first, last): the search reads the BM25 scores of those rows only
        (`_scored_block`), so only theirs are computed; the others stay zero."""
        with self._query_lock:
            bm25_all = self._bm25_cache.get((query_text, block))
            vector_known = query_text in self._vector_cache
            vector = self._vector_cache.get(query_text)
        if bm25_all is None:
            bm25_all = self.index.text.scores(query_text, block)
            bm25_all.setflags(write=False)
        if not vector_known:
            vector = self.provider.embed([query_text])[0] if self.provider is not None else None
            if vector is not None:
                vector.setflags(write=False)
        with self._query_lock:
            _remember(self._bm25_cache, (query_text, block), bm25_all)
            _remember(self._vector_cache, query_text, vector)
        return bm25_all, vector

    # --- the delta segment (live writes since the published version) -------------------------

    def overlay(self) -> Overlay:
        """The live writes not in this version yet (`delta.py`), as they stand now."""
        return current_overlay(self.index, self.index_dir, self._embed_documents)

    def _embed_documents(self, texts: list[str]) -> np.ndarray:
        if self.provider is None:
            return np.zeros((len(texts), 0), dtype=np.float32)
        return self.provider.embed(texts)

    @staticmethod
    def _visible(
        pool: np.ndarray, values: np.ndarray, hidden: np.ndarray, scope: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Drop rows the delta hid from an unscoped pool (a scoped one never held them)."""
        if scope is not None or len(hidden) == 0 or len(pool) == 0:
            return pool, values
        keep = ~np.isin(pool, hidden)
        return pool[keep], values[keep]

    def _fusion(
        self, bm25: np.ndarray, cosine: np.ndarray, query_vector: np.ndarray | None
    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """The z-score fusion with statistics of `bm25` and `cosine` themselves."""
        bm25_stats = (float(bm25.mean()), float(bm25.std())) if len(bm25) else (0.0, 0.0)
        cos_stats = (float(cosine.mean()), float(cosine.std())) if len(cosine) else (0.0, 0.0)
        return self._fuse_with(bm25_stats, cos_stats, query_vector)

    def _fuse_with(
        self,
        bm25_stats: tuple[float, float],
        cos_stats: tuple[float, float],
        query_vector: np.ndarray | None,
    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        w_text, w_vec = self.settings.text_weight, self.settings.vector_weight
        if query_vector is None:
            w_vec = 0.0
        total = (w_text + w_vec) / 2 or 1.0

        def fuse(bm25: np.ndarray, cosine: np.ndarray) -> np.ndarray:
            bm25_z = _standardise(bm25, *bm25_stats)
            cos_z = _standardise(cosine, *cos_stats)
            return (w_text * bm25_z + w_vec * cos_z) / total

        return fuse

    def _live_speaker_boost(
        self, overlay: Overlay, live: np.ndarray, named_speaker: int | None
    ) -> np.ndarray:
        if named_speaker is None or not self.settings.speaker_boost or not len(live):
            return np.zeros(len(live))
        said = overlay.said_by(live, self.index.speakers[named_speaker])
        return self.settings.speaker_boost * said.astype(np.float64)

    def kinds(self) -> list[str]:
        """Kinds of rows this searcher can return: the version's and the delta's."""
        kinds = [value for value in self.index.codes["kind"][1] if value is not None]
        return kinds + sorted(k for k in self.overlay().kinds if k not in kinds)

    def store_users(self) -> int:
        """How many users the store names, counting users only live writes named so far
        (over-counted rather than under: a scope check fails closed)."""
        users = self.index.manifest.get("store_users")
        indexed = {value for value in self.index.codes["user_id"][1] if value is not None}
        if users is None:
            users = len(indexed)
        return int(users) + len(self.overlay().users - indexed)

    def text_of(self, hit: SearchHit) -> str:
        """The whole text of a hit (its snippet is cut at `SNIPPET_CHARS`: a shorter snippet
        is the whole text)."""
        if hit.live is not None:
            return hit.live.text
        if len(hit.snippet) < SNIPPET_CHARS:
            return hit.snippet
        return row_values(self.index.rows, [hit.row], ("text",))[0]["text"]

    def vectors_of(self, hits: Sequence[SearchHit]) -> np.ndarray:
        """The vectors of hits, in order (published rows and delta rows alike)."""
        dims = int(self.index.manifest["dims"])
        if not hits:
            return np.zeros((0, dims), dtype=np.float32)
        return np.vstack(
            [h.live.vector if h.live is not None else self.index.vectors[h.row] for h in hits]
        )

    # --- query understanding -----------------------------------------------------------------

    @staticmethod
    def _scope_key(filters: SearchFilters, scope: np.ndarray | None) -> object:
        """A cache key for the scope's participants: the whole index or one conversation."""
        if scope is None:
            return "*"
        only_conversation = SearchFilters(conversation=filters.conversation)
        return ("conversation", filters.conversation) if filters == only_conversation else None

    def _speaker_aware_query(
        self, query: str, scope_rows: np.ndarray, scope_key: object = None
    ) -> tuple[str, int | None]:
        """The query without participant names, and the one participant it names (if one)."""
        if not self.settings.speaker_aware or not self.index.speakers:
            return query, None
        codes = self._speakers_by_scope.get(scope_key) if scope_key is not None else None
        if codes is None:
            codes = np.unique(self.index.speaker_code[scope_rows])
            if scope_key is not None:
                self._speakers_by_scope[scope_key] = codes
        speakers = [self.index.speakers[c] for c in codes if c >= 0]
        if not speakers:
            return query, None
        names = participant_names(speakers)
        mentioned = {n.lower() for n in names_in(query, names)}
        named = [
            code
            for code, speaker in zip([c for c in codes if c >= 0], speakers, strict=True)
            if speaker in mentioned or speaker.split()[0] in mentioned
        ]
        named_speaker = named[0] if len(named) == 1 and len(speakers) > 1 else None
        stripped = strip_names(query, names)
        return (stripped or query), named_speaker

    # --- candidates and signals --------------------------------------------------------------

    def _cosine(self, rows: np.ndarray, query_vector: np.ndarray | None) -> np.ndarray:
        if query_vector is None or len(rows) == 0:
            return np.zeros(len(rows), dtype=np.float32)
        first, last = int(rows[0]), int(rows[-1])
        if last - first + 1 == len(rows):  # a conversation is a contiguous block: no copy
            return self.index.vectors[first : last + 1] @ query_vector
        return self.index.vectors[rows] @ query_vector

    def _candidates(
        self,
        scope: np.ndarray | None,
        scope_rows: np.ndarray,
        bm25_all: np.ndarray,
        query_vector: np.ndarray | None,
        k: int,
    ) -> np.ndarray:
        """The best `k × candidate_multiplier` rows by each signal, within the scope."""
        wanted = max(k * self.settings.candidate_multiplier, k)
        # Unscoped, the scope's rows are every row in order: no copy of every score, no lookup.
        scoped_text = bm25_all if scope is None else bm25_all[scope_rows]
        order = _top(scoped_text, wanted)
        matched = order[scoped_text[order] > 0]
        text_rows = matched if scope is None else scope_rows[matched]
        if query_vector is None:
            vector_rows = np.zeros(0, np.int64)
        elif scope is None:
            vector_rows = search_faiss(self.index.faiss_index, query_vector, wanted)[0]
        else:
            vector_rows = scope_rows[_top(self._cosine(scope_rows, query_vector), wanted)]
        return np.unique(np.concatenate([text_rows, vector_rows]))

    def _zscore(
        self,
        scope: np.ndarray | None,
        scope_rows: np.ndarray,
        bm25_all: np.ndarray,
        query_vector: np.ndarray | None,
        k: int,
    ) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
        """(pool, cosine, fuse): the pool to score, its cosines, and the fusion (standardised
        BM25 + standardised cosine, with the scope's statistics) for it and for delta rows.

        A large scope is scored on its candidates and their neighbours; the cosine mean and
        spread then come from a fixed sample of the scope rather than from every row.
        """
        if len(scope_rows) <= EXACT_SCOPE_ROWS:
            pool = scope_rows
            cosine = self._cosine(pool, query_vector)
            cos_mean, cos_std = float(cosine.mean()), float(cosine.std())
        else:
            candidates = self._candidates(scope, scope_rows, bm25_all, query_vector, k)
            neighbours = np.concatenate(
                [self.index.prev_row[candidates], self.index.next_row[candidates]]
            )
            pool = np.unique(np.concatenate([candidates, neighbours[neighbours >= 0]]))
            cosine = self._cosine(pool, query_vector)
            if query_vector is None:
                sampled = np.zeros(1)
            elif scope is None:
                sampled = self._sample_vectors @ query_vector
            else:
                sampled = self._cosine(scope_rows[:STATS_SAMPLE_ROWS], query_vector)
            cos_mean, cos_std = float(sampled.mean()), float(sampled.std())
        scoped_bm25 = bm25_all if scope is None else bm25_all[scope_rows]
        bm25_stats = (float(scoped_bm25.mean()), float(scoped_bm25.std()))
        return pool, cosine, self._fuse_with(bm25_stats, (cos_mean, cos_std), query_vector)

    def _context_boosts(
        self, pool: np.ndarray, scores: np.ndarray, named_speaker: int | None
    ) -> np.ndarray:
        """Neighbour, session and speaker boosts (see docs/retrieval.md for the evidence)."""
        settings = self.settings
        index = self.index
        if settings.neighbour_boost:
            neighbour = np.full(len(pool), -np.inf)
            for links in (index.prev_row, index.next_row):
                linked = links[pool]
                at = np.clip(np.searchsorted(pool, linked), 0, len(pool) - 1)
                valid = (linked >= 0) & (pool[at] == linked)
                neighbour = np.where(valid, np.maximum(neighbour, scores[at]), neighbour)
            neighbour = np.where(np.isfinite(neighbour), neighbour, 0.0)
            scores = scores + settings.neighbour_boost * neighbour
        if settings.session_boost:
            sessions, which = np.unique(index.path_code[pool], return_inverse=True)
            if len(sessions) > 1:
                best = np.full(len(sessions), -np.inf)
                np.maximum.at(best, which, scores)
                session_z = _standardise(best, float(best.mean()), float(best.std()))
                scores = scores + settings.session_boost * session_z[which]
        if named_speaker is not None and settings.speaker_boost:
            scores = scores + settings.speaker_boost * (index.speaker_code[pool] == named_speaker)
        return scores


def _live_hit(
    overlay: Overlay, position: int, score: float, vector_score: float, text_score: float
) -> SearchHit:
    """A hit on a delta row (a live write the published version does not hold yet)."""
    row = overlay.rows[position]
    event_time = row["event_time"]
    if isinstance(event_time, str):
        event_time = datetime.fromisoformat(event_time)
    values = {
        **row,
        "path": row["path"] or "",
        "start_line": int(row["start_line"] or 0),
        "end_line": int(row["end_line"] or 0),
        "event_time": event_time,
    }
    live = LiveRow(row["text"], overlay.vectors[position])
    return _hit_of(values, score, vector_score, text_score, live=live)


def _hit_of(
    values: Mapping[str, Any],
    score: float,
    vector_score: float,
    text_score: float,
    *,
    row: int = -1,
    live: LiveRow | None = None,
) -> SearchHit:
    """A hit from a row's `_HIT_COLUMNS` values: a published row (`row`) or a delta one
    (`live`)."""
    return SearchHit(
        id=values["id"],
        kind=values["kind"],
        source=values["source"],
        path=values["path"],
        start_line=values["start_line"],
        end_line=values["end_line"],
        score=round(score, 6),
        snippet=values["text"][:SNIPPET_CHARS],
        conversation_id=values["conversation_id"],
        session_id=values["session_id"],
        turn_ids=list(values["turn_ids"] or []),
        event_time=values["event_time"],
        vector_score=round(float(vector_score), 6),
        text_score=round(float(text_score), 6),
        role=values["role"],
        speaker=values["speaker"],
        category=values["category"],
        user_id=values["user_id"],
        agent_id=values["agent_id"],
        importance=values["importance"],
        row=row,
        live=live,
    )


def live_index(settings: Settings) -> PublishedIndex:
    """The current published version; before the first build, when live writes exist, an empty
    one to lay them over (`IndexNotBuiltError` when there is nothing at all)."""
    try:
        return cached_index(Path(settings.index_dir))
    except IndexNotBuiltError:
        if not delta_path(Path(settings.index_dir)).exists():
            raise
        provider = get_provider(settings)
        return empty_index(
            Path(settings.index_dir),
            provider=provider.name,
            model=provider.model,
            dims=int(provider.dims),
        )


def _standardise(values: np.ndarray, mean: float, std: float) -> np.ndarray:
    return (values - mean) / std if std > 0 else np.zeros(len(values))


def _blend(cosine: np.ndarray, bm25: np.ndarray, settings: Settings, has_vectors: bool):
    """Seed 002's blend: weighted cosine and BM25 scaled by the best BM25, in [0, 1]."""
    best = float(bm25.max()) if len(bm25) else 0.0
    text = bm25 / best if best > 0 else np.zeros_like(bm25)
    w_vec, w_text = (settings.vector_weight, settings.text_weight) if has_vectors else (0.0, 1.0)
    return (w_vec * np.clip(cosine, 0.0, 1.0) + w_text * text) / (w_vec + w_text)


def _ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of each score (1 = highest)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return ranks


def _rrf(cosine: np.ndarray, bm25: np.ndarray, w_vec: float, w_text: float) -> np.ndarray:
    """Weighted reciprocal-rank fusion, scaled so a row ranked first by both scores 1.0.

    Rows without any BM25 match get no text contribution (a rank among zeros means nothing).
    """
    text_part = np.where(bm25 > 0, w_text / (RRF_K + _ranks(bm25)), 0.0)
    fused = w_vec / (RRF_K + _ranks(cosine)) + text_part
    return fused / ((w_vec + w_text) / (RRF_K + 1))


_searchers: dict[tuple[str, str], Searcher] = {}


def search(
    query: str,
    *,
    settings: Settings | None = None,
    k: int | None = None,
    conversation: str | None = None,
    session: str | None = None,
    source: str | None = None,
    path: str | None = None,
    kind: str | None = None,
    min_score: float | None = None,
    fusion: Fusion | None = None,
    scope: Scope | None = None,
) -> list[SearchHit]:
    """Search the memory: `memory_dag.index.search("pizza", conversation="demo")`.

    Read through `scope` (`memory_dag/scope.py`; default: the conversation and session given):
    a store of several users needs a scope with a user (`ScopeRequired`).
    """
    settings = settings or Settings.load()
    searcher = get_searcher(settings)
    asked = ["procedural"] if kind == "procedural" else None  # procedures only by name
    scope = scope or Scope.of(conversation_id=conversation, run_id=session, categories=asked)
    scope.check_store(searcher.store_users())
    kinds = searcher.kinds()
    filters = replace(
        scope.search_filters(kinds if kind is None else [k for k in kinds if k == kind]),
        source=source,
        path=path,
    )
    if conversation is not None and filters.conversation not in (None, conversation):
        return []  # the scope names another conversation
    filters = replace(filters, conversation=filters.conversation or conversation)
    return searcher.search(query, k=k, filters=filters, min_score=min_score, fusion=fusion)


def get_searcher(settings: Settings) -> Searcher:
    """A searcher for the current index version, cached per process (warm queries are fast)."""
    index = live_index(settings)
    key = (str(resolved(settings.index_dir)), index.folder.name or "(none)")
    searcher = _searchers.get(key)
    if searcher is None or searcher.settings != settings:
        searcher = Searcher(settings, index)
        _searchers.clear()
        _searchers[key] = searcher
    return searcher
