"""Hybrid search over the published index: vector + BM25 candidates, fused, filtered, ranked.

The read path never opens the DuckDB file: it reads the last published index version
(`index_files.py`), so a search during a running pipeline neither waits nor fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memory_dag.config import Settings
from memory_dag.embeddings import get_provider
from memory_dag.index_files import PublishedIndex, cached_index
from memory_dag.vector_index import search_faiss

Fusion = Literal["blend", "rrf"]
SNIPPET_CHARS = 700
RRF_K = 60


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["event_time"] = self.event_time.isoformat() if self.event_time else None
        return data


@dataclass
class SearchFilters:
    conversation: str | None = None
    session: str | None = None
    source: str | None = None  # memory | sessions
    path: str | None = None  # exact path or a folder prefix ending in "/"
    kind: str | None = None  # note | entry | transcript


def allowed_rows(index: PublishedIndex, filters: SearchFilters) -> np.ndarray | None:
    """Row numbers that pass the filters (None = every row), computed before ranking."""
    rows: np.ndarray | None = None
    if filters.conversation is not None:
        rows = index.rows_by_conversation.get(filters.conversation, np.zeros(0, np.int64))
    if filters.session is not None:
        session_rows = index.rows_by_session.get(filters.session, np.zeros(0, np.int64))
        rows = session_rows if rows is None else np.intersect1d(rows, session_rows)
    for column, wanted in (("source", filters.source), ("kind", filters.kind)):
        if wanted is not None:
            values = index.rows[column]
            candidates = range(index.size) if rows is None else rows
            rows = np.asarray([r for r in candidates if values[r] == wanted], dtype=np.int64)
    if filters.path is not None:
        paths = index.rows["path"]
        prefix = filters.path
        candidates = range(index.size) if rows is None else rows
        rows = np.asarray(
            [
                r
                for r in candidates
                if paths[r] == prefix or (prefix.endswith("/") and paths[r].startswith(prefix))
            ],
            dtype=np.int64,
        )
    return rows


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
        self.index = index if index is not None else cached_index(Path(settings.index_dir))
        manifest = self.index.manifest
        # Queries must be embedded by the model that built the index, whatever the settings say.
        query_settings = settings.model_copy(
            update={"embedding_provider": manifest["provider"], "embedding_model": manifest["model"]}
        )
        self.provider = get_provider(query_settings) if manifest["dims"] else None

    def search(
        self,
        query: str,
        *,
        k: int | None = None,
        filters: SearchFilters | None = None,
        min_score: float | None = None,
        fusion: Fusion = "blend",
    ) -> list[SearchHit]:
        settings = self.settings
        k = settings.max_results if k is None else k
        min_score = settings.min_score if min_score is None else min_score
        index = self.index
        rows = allowed_rows(index, filters or SearchFilters())
        if index.size == 0 or k <= 0 or (rows is not None and len(rows) == 0):
            return []
        wanted = max(k * settings.candidate_multiplier, k)

        text_all = index.text.scores(query)
        query_vector = self.provider.embed([query])[0] if self.provider is not None else None

        # Candidates: the best `wanted` rows by each signal, within the allowed rows.
        if rows is None:
            text_candidates = _top(text_all, wanted)
            text_candidates = text_candidates[text_all[text_candidates] > 0]
            vector_candidates = (
                search_faiss(index.faiss_index, query_vector, wanted)[0]
                if query_vector is not None
                else np.zeros(0, np.int64)
            )
        else:
            scoped_text = text_all[rows]
            order = _top(scoped_text, wanted)
            text_candidates = rows[order[scoped_text[order] > 0]]
            if query_vector is not None:
                scoped_vec = np.asarray(index.vectors[rows]) @ query_vector
                vector_candidates = rows[_top(scoped_vec, wanted)]
            else:
                vector_candidates = np.zeros(0, np.int64)
        candidates = np.unique(np.concatenate([text_candidates, vector_candidates]))
        if len(candidates) == 0:
            return []

        # Both signals for every candidate: exact cosine, BM25 scaled by the best BM25.
        if query_vector is not None:
            cosine = np.clip(np.asarray(index.vectors[candidates]) @ query_vector, 0.0, 1.0)
        else:
            cosine = np.zeros(len(candidates), dtype=np.float32)
        bm25 = text_all[candidates]
        best_bm25 = float(bm25.max()) if len(bm25) else 0.0
        text_norm = bm25 / best_bm25 if best_bm25 > 0 else np.zeros_like(bm25)

        if fusion == "rrf":
            fused = _rrf(cosine, bm25, settings.vector_weight, settings.text_weight)
        else:
            vector_weight, text_weight = settings.vector_weight, settings.text_weight
            if query_vector is None:
                vector_weight, text_weight = 0.0, 1.0
            fused = (vector_weight * cosine + text_weight * text_norm) / (
                vector_weight + text_weight
            )

        order = np.argsort(-fused, kind="stable")
        hits: list[SearchHit] = []
        for position in order:
            score = float(fused[position])
            if score < min_score:
                break
            hits.append(
                self._hit(int(candidates[position]), score, cosine[position], text_norm[position])
            )
            if len(hits) >= k:
                break
        return hits

    def _hit(self, row: int, score: float, vector_score: float, text_score: float) -> SearchHit:
        cols = self.index.rows
        text = cols["text"][row]
        return SearchHit(
            id=cols["id"][row],
            kind=cols["kind"][row],
            source=cols["source"][row],
            path=cols["path"][row],
            start_line=cols["start_line"][row],
            end_line=cols["end_line"][row],
            score=round(score, 6),
            snippet=text[:SNIPPET_CHARS],
            conversation_id=cols["conversation_id"][row],
            session_id=cols["session_id"][row],
            turn_ids=list(cols["turn_ids"][row] or []),
            event_time=cols["event_time"][row],
            vector_score=round(float(vector_score), 6),
            text_score=round(float(text_score), 6),
        )


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
    fusion: Fusion = "blend",
) -> list[SearchHit]:
    """Search the memory: `memory_dag.search("pizza", conversation="demo")`."""
    settings = settings or Settings.load()
    searcher = get_searcher(settings)
    filters = SearchFilters(conversation, session, source, path, kind)
    return searcher.search(query, k=k, filters=filters, min_score=min_score, fusion=fusion)


def get_searcher(settings: Settings) -> Searcher:
    """A searcher for the current index version, cached per process (warm queries are fast)."""
    index = cached_index(Path(settings.index_dir))
    key = (str(Path(settings.index_dir).resolve()), index.folder.name)
    searcher = _searchers.get(key)
    if searcher is None or searcher.settings != settings:
        searcher = Searcher(settings, index)
        _searchers.clear()
        _searchers[key] = searcher
    return searcher
