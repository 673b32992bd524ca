"""What the read path returns: candidates with every signal that moved them, the stages
that ran, and the related memories offered beside the results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from memory_dag.index.search import SearchHit


@dataclass
class Candidate:
    """One search hit on its way through the stages, with every signal that moved it."""

    hit: SearchHit
    #: Rows of `memories` behind the hit: the memory itself, or the episodes of a chunk.
    memory_ids: list[str]
    #: The whole text of the index row (the hit's snippet is cut at 700 characters).
    text: str
    fused: float
    relevance: float
    score: float = 0.0
    recency: float | None = None
    relation_strength: float = 0.0
    entity_matches: int = 0
    #: A transcript turn whose statement a newer one contradicted, replaced or forgot.
    superseded: bool = False
    #: The memory that superseded it, when known.
    superseded_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.hit.to_dict(),
            "memory_ids": self.memory_ids,
            "text": self.text,
            "fused": round(self.fused, 6),
            "relevance": round(self.relevance, 6),
            "score": round(self.score, 6),
            "recency": None if self.recency is None else round(self.recency, 6),
            "relation_strength": round(self.relation_strength, 6),
            "entity_matches": self.entity_matches,
            "superseded": self.superseded,
            "superseded_by": self.superseded_by,
        }


@dataclass
class StageRun:
    """Whether a stage ran, how many candidates it left, and a word on why (not)."""

    name: str
    ran: bool
    detail: str = ""
    remaining: int | None = None


@dataclass
class RelatedMemory:
    """A candidate linked (relations table) to one of the results but not itself a result."""

    id: str
    text: str
    category: str | None
    role: str | None
    kind: str
    strength: float
    related_to: str


@dataclass
class RetrievalResult:
    query: str
    items: list[Candidate]
    stages: list[StageRun]
    related: list[RelatedMemory] = field(default_factory=list)
    #: "reranker" when a cross-encoder scored relevance, else "fused" (the search score).
    relevance_source: Literal["reranker", "fused"] = "fused"

    def stage(self, name: str) -> StageRun:
        return next(s for s in self.stages if s.name == name)

    def ran(self) -> list[str]:
        return [s.name for s in self.stages if s.ran]

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "relevance_source": self.relevance_source,
            "items": [c.to_dict() for c in self.items],
            "stages": [vars(s) for s in self.stages],
            "related": [vars(r) for r in self.related],
        }
