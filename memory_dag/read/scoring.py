"""The read path's arithmetic, pure functions pinned by the tests: reciprocal rank fusion
(seed 004), recency (seed 000 §3), min-max scaling and maximal marginal relevance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

RRF_K = 60


# --- stage arithmetic (pure functions, pinned by the tests) ---------------------------------


def rrf_scores(rankings: Sequence[Sequence[Any]], k: int = RRF_K) -> dict[Any, float]:
    """Seed 004: score(x) = Σ over the rankings that hold x of 1 / (k + rank), rank from 1."""
    scores: dict[Any, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return scores


def recency_score(age_days: float, scale_days: float = 30.0) -> float:
    """exp(−age/scale); a date in the future counts as now."""
    return math.exp(-max(age_days, 0.0) / scale_days)


def with_recency(relevance: float, recency: float, weight: float) -> float:
    """Seed 000 §3 step 3: (1 − w)·relevance + w·recency."""
    return (1.0 - weight) * relevance + weight * recency


def min_max(values: np.ndarray) -> np.ndarray:
    """Values scaled to [0, 1] (all ones when they are equal)."""
    if len(values) == 0 or values.min() == values.max():
        return np.ones(len(values))
    return (values - values.min()) / (values.max() - values.min())


def mmr_order(scores: np.ndarray, vectors: np.ndarray, k: int, lam: float) -> list[int]:
    """Positions chosen greedily by λ·score − (1 − λ)·max cosine to the chosen ones.

    The first pick is the best score. Vectors are normalised here, so any scale works.
    """
    count = len(scores)
    if count == 0 or k <= 0:
        return []
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors, dtype=np.float64), where=norms > 0)
    similarity = unit @ unit.T
    chosen: list[int] = []
    max_sim = np.full(count, -np.inf)
    available = np.ones(count, dtype=bool)
    for _ in range(min(k, count)):
        penalty = np.where(np.isfinite(max_sim), max_sim, 0.0)
        value = np.where(available, lam * scores - (1.0 - lam) * penalty, -np.inf)
        pick = int(np.argmax(value))
        chosen.append(pick)
        available[pick] = False
        max_sim = np.maximum(max_sim, similarity[pick])
    return chosen


# --- results -------------------------------------------------------------------------------
