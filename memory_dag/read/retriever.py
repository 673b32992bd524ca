"""The read path after hybrid search: the stages that decide which memories an agent sees.

Seed 000 §3 (rerank, threshold, recency, MMR), seed 003 §2 and §3 (relation boost, low weight
for insights), seed 004 (RRF of text, vector and entity rankings). Every stage can be switched
off in `RetrievalConfig`, and `RetrievalResult.stages` records which ran and why not:

1. candidates  `Searcher.search` with k = max(top_k · pool_factor, min_pool): filters apply
               inside the index; relevance starts as the fused search score.
2. liveness    memories soft-deleted or expired since the index was published are dropped
               (a snapshot of the store's inactive ids and relations, read again only when
               the store file changed; without one, when the store is busy, the stage says so).
3. entities    with fusion "rrf", candidates linked to an entity the query names form a third
               ranking: relevance = Σ 1/(60 + rank) over text, vector and entity rankings,
               divided by its maximum (1.0 = first everywhere).
4. rerank      relevance = sigmoid(cross-encoder logit) when a model is configured.
5. threshold   candidates with relevance < score_threshold are dropped.
6. recency     score = (1 − w)·relevance + w·exp(−age_days / 30).
7. relations   score += w_rel · (strongest relation to a live memory). The related memories
               offered beside the results are other candidates of the pool, so they passed
               the same filters (categories, user) inside the index.
8. insight     score ·= insight_weight for `insight` memories.
8b. current   what the memory holds now ranks first. A transcript turn whose statement a
               newer one contradicted or replaced (or that was forgotten) is marked superseded,
               keeps score ·= superseded_weight and stays below the memory that superseded it
               when that is a candidate too (the context block leaves it out: it is no longer
               current). A turn ranks just below a fact drawn from it when both are
               candidates: the fact says what the memory concluded from the turn.
9. mmr         greedy λ·score − (1 − λ)·max cosine to what is already selected, over the
               candidates' index vectors, with the scores min-max scaled to [0, 1] over the
               pool first: cosines span [0, 1], while fused scores crowd into ~0.3–0.7 (the
               z-score's sigmoid), where λ = 0.7 would rank an unrelated memory above a
               relevant one that is merely similar to the first pick. Without mmr: the top_k.

The ids of the returned memories go to an access log (queue files next to the store) that a
pipeline run adds to `access_count` / `last_accessed` (`apply_access_log`): a read never
writes to DuckDB, whose single writer may be busy.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeGuard

import numpy as np
from pydantic import BaseModel, Field

from memory_dag.config import Settings
from memory_dag.index.delta import Overlay
from memory_dag.index.search import Fusion, Searcher, SearchFilters, get_searcher
from memory_dag.read import scoring
from memory_dag.read.access_log import AccessLog, get_access_log
from memory_dag.read.rerank import load_reranker
from memory_dag.read.results import Candidate, RetrievalResult, StageRun
from memory_dag.read.store_signals import (
    StoreSignals,
    entity_matches,
    memory_ids_of,
    query_entity_names,
    related_candidates,
    store_snapshot,
    with_live_writes,
)

SECONDS_PER_DAY = 86_400.0


class RetrievalConfig(BaseModel):
    """The stages of the read path and their parameters (defaults from seeds 000, 003, 004)."""

    fusion: Fusion | None = Field(None, description="None: the Settings' fusion (zscore)")
    #: Seed 000: top_k × 3 candidates; at least `min_pool` so MMR and pruning have a choice.
    pool_factor: int = Field(3, ge=1)
    min_pool: int = Field(30, ge=1)
    #: Look at the store (liveness, relations, entities); off = the index alone.
    store_signals: bool = True
    #: Seconds to wait for the store when a pipeline holds it; 0 = skip those stages at once.
    store_lock_timeout: float = Field(0.0, ge=0.0)
    entities: bool = True
    rerank: bool = True
    reranker_model: str | None = None
    threshold: bool = True
    score_threshold: float = Field(0.35, ge=0.0, le=1.0)
    recency: bool = True
    recency_weight: float = Field(0.2, ge=0.0, le=1.0)
    recency_scale_days: float = Field(30.0, gt=0.0)
    relations: bool = True
    relation_weight: float = Field(0.1, ge=0.0)
    insight: bool = True
    insight_weight: float = Field(0.5, ge=0.0, le=1.0)
    current: bool = True
    superseded_weight: float = Field(0.5, ge=0.0, le=1.0)
    mmr: bool = True
    mmr_lambda: float = Field(0.7, ge=0.0, le=1.0)
    track_access: bool = True


class Retriever:
    """The configured read path over the current published index."""

    def __init__(
        self,
        settings: Settings,
        config: RetrievalConfig | None = None,
        *,
        searcher: Searcher | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self.settings = settings
        self.config = config or RetrievalConfig()
        self._searcher = searcher
        self.reranker = load_reranker(self.config.reranker_model) if self.config.rerank else None
        self.access_log = access_log

    @property
    def searcher(self) -> Searcher:
        """The given searcher, or the one for the index version live right now."""
        return self._searcher if self._searcher is not None else get_searcher(self.settings)

    def retrieve(
        self,
        query: str,
        *,
        top_k: int = 5,
        filters: SearchFilters | None = None,
        threshold: float | None = None,
        exclude_session: str | None = None,
        now: datetime | None = None,
    ) -> RetrievalResult:
        """Run the stages; `threshold` overrides `score_threshold` for this call.

        `exclude_session` drops that session's candidates from the pool (seed 004: inject only
        what earlier sessions said); `pool_factor` leaves enough candidates for top_k.
        """
        config = self.config
        searcher = self.searcher  # one index version for the whole call
        now = now or datetime.now(UTC)
        fusion = config.fusion or self.settings.fusion
        stages: list[StageRun] = []
        pool_size = max(top_k * config.pool_factor, config.min_pool)
        hits = searcher.search(query, k=pool_size, filters=filters, min_score=0.0, fusion=fusion)
        if exclude_session is not None:
            hits = [h for h in hits if h.session_id != exclude_session]
        pool = [Candidate(h, memory_ids_of(h), searcher.text_of(h), h.score, h.score) for h in hits]
        stages.append(StageRun("candidates", True, f"fusion {fusion}", len(pool)))

        pool, signals = self._liveness_stage(query, pool, fusion, stages, searcher.overlay())
        self._entity_stage(pool, signals, fusion, stages)
        source = self._rerank_stage(query, pool, stages)
        candidates = list(pool)  # before the threshold: related memories need not match
        pool = self._threshold_stage(pool, threshold, stages)
        for candidate in pool:
            candidate.score = candidate.relevance
        self._recency_stage(pool, now, stages)
        if self._store_stage(signals, "relations", config.relations, stages):
            self._relations_stage(pool, signals, stages)
        self._insight_stage(pool, stages)
        if self._store_stage(signals, "current", config.current, stages):
            self._current_stage(pool, signals, stages)
        items = self._select(pool, top_k, searcher, stages)

        shown = {i for c in items for i in c.memory_ids}
        related = related_candidates(items, candidates, signals) if config.relations else []
        if config.track_access and shown:
            log = self.access_log or get_access_log(self.settings)
            log.record([i for c in items for i in c.memory_ids], now)
        return RetrievalResult(query, items, stages, related, source)

    # --- stages ------------------------------------------------------------------------------

    def _liveness_stage(
        self,
        query: str,
        pool: list[Candidate],
        fusion: str,
        stages: list[StageRun],
        overlay: Overlay,
    ) -> tuple[list[Candidate], StoreSignals | None]:
        config = self.config
        if not config.store_signals:
            stages.append(StageRun("liveness", False, "store signals off"))
            return pool, None
        db_path = Path(self.settings.db_path)
        snapshot, why = store_snapshot(db_path, config.store_lock_timeout)
        if snapshot is None and not overlay.hidden:
            stages.append(StageRun("liveness", False, f"{why}: the published index stands"))
            return pool, None
        signals = with_live_writes(snapshot or StoreSignals(), overlay)
        names = query_entity_names(query) if config.entities and fusion == "rrf" else []
        if names:
            ids = sorted({i for c in pool for i in c.memory_ids})
            signals.entity_matches = (
                entity_matches(db_path, ids, names, config.store_lock_timeout) or {}
            )
        live = [c for c in pool if not signals.dead.intersection(c.memory_ids)]
        detail = f"{len(pool) - len(live)} no longer active ({why})"
        stages.append(StageRun("liveness", True, detail, len(live)))
        return live, signals

    def _entity_stage(
        self,
        pool: list[Candidate],
        signals: StoreSignals | None,
        fusion: str,
        stages: list[StageRun],
    ) -> None:
        if not self.config.entities:
            stages.append(StageRun("entities", False, "off"))
            return
        if fusion != "rrf":
            stages.append(StageRun("entities", False, f"needs rank fusion (rrf), not {fusion}"))
            return
        if signals is None:
            stages.append(StageRun("entities", False, "store not read"))
            return
        for candidate in pool:
            candidate.entity_matches = max(
                (signals.entity_matches.get(i, 0) for i in candidate.memory_ids), default=0
            )
        positions = range(len(pool))
        entity = [p for p in positions if pool[p].entity_matches > 0]
        if not entity:
            stages.append(StageRun("entities", False, "no candidate names an entity of the query"))
            return
        rankings = [
            sorted(
                (p for p in positions if pool[p].hit.text_score > 0),
                key=lambda p: -pool[p].hit.text_score,
            ),
            sorted(positions, key=lambda p: -pool[p].hit.vector_score),
            sorted(entity, key=lambda p: -pool[p].entity_matches),
        ]
        rankings = [r for r in rankings if r]
        fused = scoring.rrf_scores(rankings)
        best = len(rankings) / (scoring.RRF_K + 1)
        for position, candidate in enumerate(pool):
            candidate.relevance = fused.get(position, 0.0) / best
        pool.sort(key=lambda c: -c.relevance)
        stages.append(StageRun("entities", True, f"{len(entity)} entity matches", len(pool)))

    def _rerank_stage(
        self, query: str, pool: list[Candidate], stages: list[StageRun]
    ) -> Literal["reranker", "fused"]:
        if not self.config.rerank:
            stages.append(StageRun("rerank", False, "off: relevance is the fused search score"))
            return "fused"
        if self.reranker is None:
            stages.append(
                StageRun("rerank", False, "no reranker model: relevance is the fused search score")
            )
            return "fused"
        scores = self.reranker.score(query, [c.text for c in pool])
        for candidate, score in zip(pool, scores, strict=True):
            candidate.relevance = float(score)
        pool.sort(key=lambda c: -c.relevance)
        stages.append(StageRun("rerank", True, self.reranker.model, len(pool)))
        return "reranker"

    def _threshold_stage(
        self, pool: list[Candidate], threshold: float | None, stages: list[StageRun]
    ) -> list[Candidate]:
        if not self.config.threshold:
            stages.append(StageRun("threshold", False, "off"))
            return pool
        cut = self.config.score_threshold if threshold is None else threshold
        kept = [c for c in pool if c.relevance >= cut]
        stages.append(StageRun("threshold", True, f"relevance >= {cut}", len(kept)))
        return kept

    def _recency_stage(self, pool: list[Candidate], now: datetime, stages: list[StageRun]) -> None:
        config = self.config
        if not config.recency:
            stages.append(StageRun("recency", False, "off"))
            return
        undated = 0
        for candidate in pool:
            when = candidate.hit.event_time
            if when is None:
                undated += 1  # notes without a date keep their relevance
                continue
            age = (now - when).total_seconds() / SECONDS_PER_DAY
            candidate.recency = scoring.recency_score(age, config.recency_scale_days)
            candidate.score = scoring.with_recency(
                candidate.relevance, candidate.recency, config.recency_weight
            )
        detail = f"w {config.recency_weight}, scale {config.recency_scale_days} d"
        stages.append(StageRun("recency", True, f"{detail}, {undated} undated", len(pool)))

    @staticmethod
    def _store_stage(
        signals: StoreSignals | None, name: str, enabled: bool, stages: list[StageRun]
    ) -> TypeGuard[StoreSignals]:
        """Whether a stage that needs the store's `signals` runs; records why not."""
        if enabled and signals is not None:
            return True
        stages.append(StageRun(name, False, "store not read" if enabled else "off"))
        return False

    def _relations_stage(
        self, pool: list[Candidate], signals: StoreSignals, stages: list[StageRun]
    ) -> None:
        linked = 0
        for candidate in pool:
            strengths = [signals.edges[i][0][1] for i in candidate.memory_ids if i in signals.edges]
            if strengths:
                candidate.relation_strength = max(strengths)
                candidate.score += self.config.relation_weight * candidate.relation_strength
                linked += 1
        detail = f"w {self.config.relation_weight}, {linked} linked"
        stages.append(StageRun("relations", True, detail, len(pool)))

    def _insight_stage(self, pool: list[Candidate], stages: list[StageRun]) -> None:
        if not self.config.insight:
            stages.append(StageRun("insight", False, "off"))
            return
        insights = [c for c in pool if c.hit.kind == "insight"]
        for candidate in insights:
            candidate.score *= self.config.insight_weight
        detail = f"x {self.config.insight_weight} for {len(insights)} insights"
        stages.append(StageRun("insight", True, detail, len(pool)))

    def _current_stage(
        self, pool: list[Candidate], signals: StoreSignals, stages: list[StageRun]
    ) -> None:
        by_memory = {i: c for c in pool for i in c.memory_ids}
        marked = below_fact = 0
        for candidate in pool:
            overruled = [i for i in candidate.memory_ids if i in signals.superseded]
            if overruled:
                candidate.superseded = True
                candidate.superseded_by = signals.superseded[overruled[0]]
                candidate.score *= self.config.superseded_weight
                newer = by_memory.get(candidate.superseded_by or "")
                if newer is not None:
                    candidate.score = min(candidate.score, newer.score - 1e-6)
                marked += 1
                continue
            drawn = [
                by_memory[fact]
                for i in candidate.memory_ids
                for fact in signals.facts_of.get(i, [])
                if fact in by_memory
            ]
            if drawn:
                candidate.score = min(candidate.score, min(f.score for f in drawn) - 1e-6)
                below_fact += 1
        detail = (
            f"{marked} superseded turns x {self.config.superseded_weight}, "
            f"{below_fact} turns below their facts"
        )
        stages.append(StageRun("current", True, detail, len(pool)))

    def _select(
        self, pool: list[Candidate], top_k: int, searcher: Searcher, stages: list[StageRun]
    ) -> list[Candidate]:
        config = self.config
        ranked = sorted(pool, key=lambda c: -c.score)
        if not config.mmr:
            stages.append(StageRun("mmr", False, "off"))
            return ranked[:top_k]
        if not searcher.index.manifest["dims"]:
            stages.append(StageRun("mmr", False, "the index has no vectors"))
            return ranked[:top_k]
        vectors = np.asarray(searcher.vectors_of([c.hit for c in ranked]), dtype=np.float64)
        scores = scoring.min_max(np.asarray([c.score for c in ranked]))
        items = [ranked[p] for p in scoring.mmr_order(scores, vectors, top_k, config.mmr_lambda)]
        stages.append(StageRun("mmr", True, f"lambda {config.mmr_lambda}", len(items)))
        return items
