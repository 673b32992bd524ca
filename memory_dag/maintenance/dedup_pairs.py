"""Dedup, part 1: which pairs of facts are worth judging (seed 003 §4).

Candidates (facts changed in 72 h, importance >= 3, or in the top decile by access count) are
paired with facts of the same scope (user, else conversation). A pair is kept when its cosine
is >= 0.75, its newer member changed in the last 90 days, and the texts share content words
(Jaccard >= 0.3) or differ by a number ("2 kids" / "3 kids").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.maintenance.common import ACTOR, MaintenanceConfig
from memory_dag.memories.reconcile import tokens
from memory_dag.scope import OWNER_SQL
from memory_dag.store.connection import fetch_arrow

_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
#: Words that say nothing about what a fact is about ("user" is in every fact about the user).
_STOPWORDS = frozenset(
    {"a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "for", "with", "by"}
    | {"from", "as", "is", "are", "was", "were", "be", "been", "has", "have", "had", "do"}
    | {"does", "did", "not", "no", "user", "user's", "their", "there", "this", "that", "it"}
    | {"its", "into", "about", "than", "then", "so", "very", "also"}
)


def content_words(text: str) -> set[str]:
    return {word for word in tokens(text) if word not in _STOPWORDS and not word.isdigit()}


def numeric_step(a: str, b: str) -> bool:
    """The two texts say the same thing with different numbers ("2 kids" / "3 kids")."""
    numbers_a, numbers_b = _NUMBER.findall(a), _NUMBER.findall(b)
    if not numbers_a or not numbers_b or numbers_a == numbers_b:
        return False
    return _NUMBER.sub("#", a.lower()).split() == _NUMBER.sub("#", b.lower()).split()


def lexical_overlap(a: str, b: str) -> float:
    """Jaccard of the content words (stopwords and 'user' left out)."""
    words_a, words_b = content_words(a), content_words(b)
    if not words_a or not words_b:
        return 0.0
    return len(words_a & words_b) / len(words_a | words_b)


@dataclass
class FactRow:
    id: str
    content: str
    scope: str
    conversation_id: str | None
    created_at: datetime
    changed_at: datetime
    importance: int
    pinned: bool
    access_count: int
    last_accessed: datetime | None
    confidence: float
    decay_rate: float
    source_ids: list[str]
    tags: list[str]


@dataclass
class Pair:
    older: FactRow
    newer: FactRow
    score: float
    why: str

    @property
    def fingerprint(self) -> str:
        """Seed 003 §4: (id_a, id_b, round(score, 2)), prefixed by the scope for the daily cap."""
        first, second = sorted((self.older.id, self.newer.id))
        return f"{self.newer.scope}|{first}|{second}|{self.score:.2f}"


def _changed_times(con: Any, since: datetime) -> dict[str, datetime]:
    """When each memory last changed, not counting this job's own merges (a merge must not
    pull its survivor into tomorrow's pool, or a second run the same day into more work)."""
    rows = con.execute(
        "SELECT memory_id, max(ts) FROM history WHERE ts >= ? AND memory_id IS NOT NULL "
        "AND actor <> ? GROUP BY memory_id",
        [since, ACTOR],
    ).fetchall()
    return {row[0]: row[1] for row in rows}


def _load_facts(con: Any, provider_name: str, model: str) -> tuple[list[FactRow], np.ndarray, int]:
    """Active facts with their cached vectors (rows without one are zero; see `_fill_vectors`)."""
    table = fetch_arrow(
        con,
        f"""
        SELECT m.id, m.content, {OWNER_SQL} AS scope, m.conversation_id, m.created_at,
               m.importance, m.pinned, m.access_count, m.last_accessed, m.confidence,
               m.decay_rate, m.source_ids, m.tags, e.embedding
        FROM facts m LEFT JOIN embedding_cache e
          ON e.provider = ? AND e.model = ? AND e.hash = sha256(m.content)
        ORDER BY m.created_at, m.id
        """,
        [provider_name, model],
    )
    rows = [
        FactRow(
            id=r["id"],
            content=r["content"],
            scope=r["scope"],
            conversation_id=r["conversation_id"],
            created_at=r["created_at"],
            changed_at=r["created_at"],
            importance=int(r["importance"]),
            pinned=bool(r["pinned"]),
            access_count=int(r["access_count"]),
            last_accessed=r["last_accessed"],
            confidence=float(r["confidence"]),
            decay_rate=float(r["decay_rate"]),
            source_ids=list(r["source_ids"] or []),
            tags=list(r["tags"] or []),
        )
        for r in table.drop_columns(["embedding"]).to_pylist()
    ]
    column = table.column("embedding").combine_chunks()
    present = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    dims = values.size // int(present.sum()) if present.any() else 0
    vectors = np.zeros((len(rows), dims), dtype=np.float32)
    if dims:
        vectors[present] = values.reshape(-1, dims)
    return rows, vectors, int((~present).sum())


def _fill_vectors(settings: Settings, rows: list[FactRow], vectors: np.ndarray) -> np.ndarray:
    """Embed the facts the cache does not hold yet (no connection is open meanwhile)."""
    missing = [i for i in range(len(rows)) if not vectors.shape[1] or not vectors[i].any()]
    if not missing:
        return vectors
    embedded = get_provider(settings).embed([rows[i].content for i in missing])
    if vectors.shape[1] != embedded.shape[1]:
        vectors = np.zeros((len(rows), embedded.shape[1]), dtype=np.float32)
        missing = list(range(len(rows)))
        embedded = get_provider(settings).embed([row.content for row in rows])
    vectors[missing] = embedded
    return vectors


def _normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def candidate_pool(rows: list[FactRow], now: datetime, config: MaintenanceConfig) -> list[int]:
    """Seed 003 §4: changed in the last 72 h, or important, or often retrieved (top decile)."""
    if not rows:
        return []
    recent = now - timedelta(hours=config.dedup_changed_hours)
    counts = np.array([row.access_count for row in rows])
    frequent = float(np.quantile(counts, config.dedup_access_quantile))
    return [
        i
        for i, row in enumerate(rows)
        if row.changed_at >= recent
        or row.importance >= config.dedup_importance_min
        or (row.access_count > 0 and row.access_count >= frequent)
    ]


#: Partners looked at per candidate: the nearest ones by cosine (bounds the nightly work).
PARTNERS_PER_CANDIDATE = 5
_BLOCK_ROWS = 512


def prefilter_pairs(
    rows: list[FactRow],
    vectors: np.ndarray,
    candidates: list[int],
    now: datetime,
    config: MaintenanceConfig,
) -> list[Pair]:
    """Pairs worth judging, best first, found without an LLM (seed 003 §4 pre-filters)."""
    unit = _normalised(vectors)
    by_scope: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_scope.setdefault(row.scope, []).append(i)
    wanted = set(candidates)
    recent = now - timedelta(days=config.dedup_recency_days)
    pairs: dict[tuple[str, str], Pair] = {}
    for members in by_scope.values():
        scope_candidates = [i for i in members if i in wanted]
        if len(members) < 2 or not scope_candidates:
            continue
        member_array = np.array(members)
        for start in range(0, len(scope_candidates), _BLOCK_ROWS):
            block = scope_candidates[start : start + _BLOCK_ROWS]
            scores = unit[block] @ unit[member_array].T
            k = min(PARTNERS_PER_CANDIDATE + 1, len(members))
            nearest = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            for row_in_block, candidate in enumerate(block):
                for column in nearest[row_in_block]:
                    other = int(member_array[column])
                    score = float(scores[row_in_block, column])
                    if other == candidate or score < config.dedup_cosine_min:
                        continue
                    a, b = sorted(
                        (rows[candidate], rows[other]), key=lambda r: (r.created_at, r.id)
                    )
                    if max(a.changed_at, b.changed_at) < recent or (a.id, b.id) in pairs:
                        continue
                    if numeric_step(a.content, b.content):
                        why = "numeric step"
                    elif lexical_overlap(a.content, b.content) >= config.dedup_min_overlap:
                        why = "lexical overlap"
                    else:
                        continue
                    pairs[(a.id, b.id)] = Pair(a, b, round(score, 4), why)
    return sorted(pairs.values(), key=lambda p: (-p.score, p.older.id, p.newer.id))
