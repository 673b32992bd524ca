"""memory.query (seed 003 §6, §6.1, §11): the one memory tool of the supervisor and sub-agents.

    query_memory(MemoryQuery(agent="planner", query="deployment plan", categories=["tasks"]),
                 scope=Scope.of(user_id="alice"), settings=settings)

Enforced here, whatever the request says, through the scope boundary (`memory_dag/scope.py`):
- categories ⊆ the agent's allowlist (`categories.yaml`), else `AccessDenied`;
- the caller's scope (its user bound by the server, never taken from the request) scopes
  every read; a request filter naming another user is `AccessDenied`; a scoped store (memories
  of several users) asked without a user is `ScopeRequired`;
- every filter is a `SearchFilters` field, applied to the index rows before ranking;
- `procedural` memories only when the request names that category;
- a transcript turn superseded by a newer fact is ranked below it and marked (`superseded_by`);
- the results' texts fit `budget_tokens` (tiktoken counts; whole results, and only when not
  even the first fits is it cut).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memory_dag.config import Settings
from memory_dag.index.search import SearchFilters
from memory_dag.ingest.tokens import count_tokens, decode, encode, get_encoding
from memory_dag.memories.categories import AccessDenied, CategoryConfig, load_categories
from memory_dag.memory_results import Result
from memory_dag.read.results import Candidate
from memory_dag.read.retriever import RetrievalConfig, Retriever
from memory_dag.scope import Scope

ELLIPSIS = "…"
#: Seed 000 §3: summaries are not ranked with memories (the context block shows the final one).
UNRANKED_KINDS = ("summary",)


class QueryFilters(BaseModel):
    """Seed 003 §6.1's filter keys; each narrows the search inside the index."""

    model_config = ConfigDict(extra="forbid")

    user_id: str | None = None
    agent_id: str | None = None
    #: One run of a conversation: a session (`SearchFilters.session`).
    run_id: str | None = None
    #: Who said or wrote it: the speaker (`SearchFilters.speaker`).
    actor_id: str | None = None
    role: str | None = None
    category: str | None = None
    pinned: bool | None = None
    importance_min: int | None = Field(None, ge=1, le=5)
    importance_max: int | None = Field(None, ge=1, le=5)
    updated_after: datetime | None = None
    updated_before: datetime | None = None


class MemoryQuery(BaseModel):
    """The request, as in seed 003 §6 (`return` is a Python keyword: the field is `return_`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    agent: str = Field(min_length=1)
    query: str = Field(min_length=1)
    categories: list[str] | None = None
    filters: QueryFilters = Field(default_factory=QueryFilters)
    top_k: int = Field(5, ge=1, le=100)
    return_: Literal["bullets", "full"] = Field("bullets", alias="return")
    budget_tokens: int | None = Field(None, ge=1)
    #: Drop results whose relevance is below this (default: the retrieval score_threshold).
    threshold: float | None = Field(None, ge=0.0, le=1.0)


class MemoryBullet(BaseModel):
    id: str
    category: str | None
    text: str


class MemoryFull(MemoryBullet):
    kind: str
    #: A transcript turn a newer statement superseded, and what superseded it (when known).
    superseded: bool = False
    superseded_by: str | None = None
    score: float
    relevance: float
    source: str
    path: str
    start_line: int
    end_line: int
    conversation_id: str | None
    session_id: str | None
    turn_ids: list[str]
    event_time: datetime | None
    role: str | None
    speaker: str | None


class MemoryQueryResponse(Result):
    """The answer of memory.query (`to_dict()` names the mode `return`, as the request does)."""

    agent: str
    #: The categories actually read (the request's, or the agent's allowlist).
    categories: list[str]
    return_: Literal["bullets", "full"] = Field(alias="return")
    results: list[MemoryFull] | list[MemoryBullet]
    #: tiktoken count of the results' texts; never above budget_tokens.
    tokens: int
    budget_tokens: int | None
    #: Results left out to stay within the budget.
    dropped: int
    relevance_source: str
    stages: list[str]


def request_scope(
    request: MemoryQuery, caller: Scope | None, categories: CategoryConfig
) -> tuple[Scope, list[str]]:
    """The scope a request reads and its categories in order; AccessDenied if not allowed.

    `caller` is who asks (its user bound by the server). The request may narrow it: its
    categories (within the agent's allowlist), `filters.category`, `filters.run_id`, and, for
    a caller without a user, `filters.user_id`.
    """
    caller = caller or Scope()
    if caller.agent is not None and caller.agent != request.agent:
        raise AccessDenied(
            f"the request names agent {request.agent!r}; the caller is {caller.agent!r}"
        )
    given = request.filters
    if caller.user_id is not None and given.user_id not in (None, caller.user_id):
        raise AccessDenied(f"filters.user_id {given.user_id!r} is not the caller's user")
    wanted = categories.resolve(request.agent, request.categories)
    if given.category is not None:
        allowed = categories.allowlist(request.agent)
        if given.category not in allowed:
            raise AccessDenied(
                f"agent {request.agent!r} may not read {[given.category]}; "
                f"its allowlist is {allowed}"
            )
        wanted = [c for c in wanted if c == given.category]
    if caller.categories is not None and not set(wanted) <= caller.categories:
        denied = sorted(set(wanted) - caller.categories)
        raise AccessDenied(f"the caller may not read {denied}")
    scope = Scope.of(
        user_id=caller.user_id or given.user_id,
        agent=request.agent,
        run_id=given.run_id or caller.run_id,
        conversation_id=caller.conversation_id,
        categories=request.categories,
        config=categories,
    )
    return replace(scope, categories=frozenset(wanted)), wanted


def query_filters(request: MemoryQuery, scope: Scope, kinds: list[str]) -> SearchFilters:
    """The index filters of a request: the scope's, then the request's own narrowing filters."""
    given = request.filters
    return replace(
        scope.search_filters(kinds, exclude=UNRANKED_KINDS),
        agent_id=given.agent_id,
        speaker=given.actor_id,
        role=given.role,
        pinned=given.pinned,
        importance_min=given.importance_min,
        importance_max=given.importance_max,
        updated_after=given.updated_after,
        updated_before=given.updated_before,
    )


def index_kinds(retriever: Retriever) -> list[str]:
    """Kinds present in the live index and its delta (the kind filter lists the accepted ones)."""
    return retriever.searcher.kinds()


def query_memory(
    request: MemoryQuery,
    *,
    scope: Scope | None = None,
    settings: Settings | None = None,
    categories: CategoryConfig | None = None,
    retriever: Retriever | None = None,
    config: RetrievalConfig | None = None,
) -> MemoryQueryResponse:
    """Answer one memory.query call; `scope` is the caller (its user bound by the server)."""
    settings = settings or Settings.load()
    categories = categories or load_categories()
    retriever = retriever or Retriever(settings, config)
    scope, wanted = request_scope(request, scope, categories)
    scope.check_store(retriever.searcher.store_users())
    filters = query_filters(request, scope, index_kinds(retriever))
    result = retriever.retrieve(
        request.query, top_k=request.top_k, filters=filters, threshold=request.threshold
    )
    rendered = [_render(c, request.return_, categories.uncategorized) for c in result.items]
    results, tokens = fit_results(rendered, request.budget_tokens)
    return MemoryQueryResponse(
        agent=request.agent,
        categories=wanted,
        return_=request.return_,
        results=results,
        tokens=tokens,
        budget_tokens=request.budget_tokens,
        dropped=len(rendered) - len(results),
        relevance_source=result.relevance_source,
        stages=result.ran(),
    )


def _render(
    candidate: Candidate, mode: Literal["bullets", "full"], uncategorized: str | None
) -> MemoryBullet:
    hit = candidate.hit
    category = hit.category or uncategorized
    # The memory behind the hit (a turn's episode id), so `history` and `forget` take it.
    memory_id = candidate.memory_ids[0] if len(candidate.memory_ids) == 1 else hit.id
    if mode == "bullets":
        line = " ".join(candidate.text.split())
        label = f"{category}, superseded" if candidate.superseded else category
        return MemoryBullet(id=memory_id, category=category, text=f"[{label}] {line}")
    return MemoryFull(
        id=memory_id,
        category=category,
        text=candidate.text,
        kind=hit.kind,
        superseded=candidate.superseded,
        superseded_by=candidate.superseded_by,
        score=round(candidate.score, 6),
        relevance=round(candidate.relevance, 6),
        source=hit.source,
        path=hit.path,
        start_line=hit.start_line,
        end_line=hit.end_line,
        conversation_id=hit.conversation_id,
        session_id=hit.session_id,
        turn_ids=hit.turn_ids,
        event_time=hit.event_time,
        role=hit.role,
        speaker=hit.speaker,
    )


def fit_results(results: list[MemoryBullet], budget: int | None) -> tuple[list[MemoryBullet], int]:
    """The leading results whose texts fit `budget` tokens, and their token count.

    Results are kept whole; only when the first alone is too long is it cut to the budget.
    """
    counts = [count_tokens(r.text) for r in results]
    if budget is None:
        return results, sum(counts)
    kept: list[MemoryBullet] = []
    total = 0
    for result, count in zip(results, counts, strict=True):
        if total + count > budget:
            break
        kept.append(result)
        total += count
    if not kept and results:
        first = results[0].model_copy(update={"text": fit_tokens(results[0].text, budget)})
        return [first], count_tokens(first.text)
    return kept, total


def fit_tokens(text: str, budget: int) -> str:
    """`text` cut to at most `budget` tokens, ending in "…" when cut."""
    if get_encoding() is None:  # no tokenizer: counts are estimates, as `count_tokens` says
        if count_tokens(text) <= budget:
            return text
        ids = encode(text)[: max(budget - 1, 0)]
    else:
        ids = encode(text)  # one encoding for the count and the cut (a summary: ~20 ms each)
        if len(ids) <= budget:
            return text
        ids = ids[: max(budget - 1, 0)]
    while ids:
        cut = decode(ids).rstrip() + ELLIPSIS
        if count_tokens(cut) <= budget:
            return cut
        ids = ids[:-1]
    return ELLIPSIS if count_tokens(ELLIPSIS) <= budget else ""
