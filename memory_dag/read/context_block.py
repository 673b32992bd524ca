"""The context block injected before an agent's turn (seed 000 §3 step 5, seed 002 proactive
query and injection hook, seed 003 §1 and §2, seed 004 context injection).

    Memory updates since rev 4:                    only when something changed (≤ 3 bullets)
    - +created: [preferences] Sam loves pizza (imp=3)
    ## Conversation summary
    <the conversation's final summary>
    ## Relevant memories
    [profile] Sam is allergic to peanuts           context: all categories first
    [user] Sam: I moved to Lisbon in May.          then the ranked memories, no scores
    ## Related
    [goals] Sam plans to learn Portuguese.         1–2 memories linked to the ones above
    ## Weekly reflection
    <the latest reflection>

The whole block fits `max_tokens` (tiktoken counts of the final text). It is filled in the
order shown; the summary takes at most `SUMMARY_SHARE` of the budget, paragraphs (summary,
reflection) are cut to the room left, and the first whole line (a change, a memory, a related
memory) that does not fit ends the block, so nothing of lower rank jumps ahead of it.

Everything in the block is read through one `Scope` (`memory_dag/scope.py`): the memories,
the related bullets (candidates of the same filtered search), the delta header (the change
log filtered by the same scope), the summary and the reflection (shown only when the scope
may read every category they were made from). A scoped store asked without a user fails.

Store reads use one short read-only connection that does not wait: while a pipeline holds
the store, the block is built from the published index alone and says so in `notes`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from memory_dag.config import Settings
from memory_dag.index.search import SearchFilters
from memory_dag.ingest.tokens import count_tokens
from memory_dag.memories.categories import CategoryConfig, load_categories
from memory_dag.memories.change_log import StoredChanges, delta_of, live_changes, stored_changes
from memory_dag.paths import resolved
from memory_dag.read.query import fit_tokens, index_kinds
from memory_dag.read.results import Candidate, RetrievalResult
from memory_dag.read.retriever import RetrievalConfig, Retriever
from memory_dag.read.store_signals import store_signature
from memory_dag.scope import Scope, store_users
from memory_dag.store.connection import StoreLockedError, fetch_dicts, open_store
from memory_dag.summaries.conversation_summaries import read_final_summary

#: Seed 002's injection hook: 5 memories, 500 tokens, minimum score 0.3.
MAX_MEMORIES = 5
MAX_TOKENS = 500
MIN_SCORE = 0.3
MAX_RELATED = 2
#: The summary gets at most this share of the budget, so memories always have room.
SUMMARY_SHARE = 0.4
#: Without `since_rev`, the delta header covers this many latest revisions (seed 003 §1).
DELTA_REVISIONS = 3
#: At most this many memories of `context: all` categories are shown.
ALWAYS_LIMIT = 10
#: Kinds that have their own section, never ranked with the memories.
OWN_SECTION_KINDS = ("summary", "reflection")


@dataclass
class ContextBlock:
    text: str
    tokens: int
    max_tokens: int
    #: The conversation's revision now: pass it as `since_rev` next time.
    rev: int | None
    #: Lines shown per section (the heading not counted).
    sections: dict[str, int] = field(default_factory=dict)
    stages: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass
class _Section:
    name: str
    heading: str | None
    lines: list[str]
    #: A paragraph is cut to the room left; other lines are kept whole.
    paragraph: bool = False
    #: The most tokens a line may use on its own (None: what is left).
    cap: int | None = None


@dataclass
class _StoreView:
    rev: int
    delta: str
    summary: str | None
    reflection: str | None


def build_context(
    message: str,
    scope: Scope,
    *,
    settings: Settings | None = None,
    max_tokens: int = MAX_TOKENS,
    max_memories: int = MAX_MEMORIES,
    min_score: float = MIN_SCORE,
    since_rev: int | None = None,
    exclude_session: str | None = None,
    categories: CategoryConfig | None = None,
    retriever: Retriever | None = None,
    config: RetrievalConfig | None = None,
    now: datetime | None = None,
) -> ContextBlock:
    """The block to inject before the agent answers `message` in the scope's conversation.

    `scope` (`Scope.of(conversation_id=..., user_id=..., agent=...)`) decides what may be
    shown; `since_rev` is the revision the agent saw last (default: the last
    `DELTA_REVISIONS` revisions).
    """
    if scope.conversation_id is None:
        raise ValueError("a context block is for one conversation: the scope names none")
    settings = settings or Settings.load()
    categories = categories or load_categories()
    retriever = retriever or Retriever(settings, config)
    scope.check_store(retriever.searcher.store_users())
    notes: list[str] = []
    filters = scope.search_filters(index_kinds(retriever), exclude=OWN_SECTION_KINDS)
    always = _always_categories(scope, categories)
    result = retriever.retrieve(
        message,
        top_k=max_memories,
        filters=filters,
        threshold=min_score,
        exclude_session=exclude_session,
        now=now,
    )
    if result.relevance_source == "fused":
        notes.append("no reranker: memories ranked by the fused search score")
    memories = _memory_lines(
        _always_shown(retriever, message, filters, always, now), result, categories
    )
    related = [
        f"[{_label(r.category, r.role, r.kind)}] {_one_line(r.text)}" for r in result.related
    ]
    view = _read_store(settings, scope, since_rev, notes)

    summary = [view.summary] if view and view.summary else []
    reflection = [view.reflection] if view and view.reflection else []
    sections = [
        _Section("delta", None, view.delta.splitlines() if view else []),
        _Section(
            "summary", "## Conversation summary", summary, True, int(max_tokens * SUMMARY_SHARE)
        ),
        _Section("memories", "## Relevant memories", memories),
        _Section("related", "## Related", related[:MAX_RELATED]),
        _Section("reflection", "## Weekly reflection", reflection, True),
    ]
    text, shown = _assemble(sections, max_tokens)
    return ContextBlock(
        text=text,
        tokens=count_tokens(text),
        max_tokens=max_tokens,
        rev=view.rev if view else None,
        sections=shown,
        stages=result.ran(),
        notes=notes,
    )


def injection_hook(
    settings: Settings,
    *,
    max_memories: int = MAX_MEMORIES,
    max_tokens: int = MAX_TOKENS,
    min_score: float = MIN_SCORE,
    config: RetrievalConfig | None = None,
) -> Callable[[str, str], str]:
    """Seed 002's memory injection hook: `hook(message, conversation_id)` → text to prepend."""
    retriever = Retriever(settings, config)

    def hook(message: str, conversation_id: str) -> str:
        return build_context(
            message,
            Scope.of(conversation_id=conversation_id),
            settings=settings,
            max_tokens=max_tokens,
            max_memories=max_memories,
            min_score=min_score,
            retriever=retriever,
        ).text

    return hook


# --- parts ---------------------------------------------------------------------------------


def _always_categories(scope: Scope, categories: CategoryConfig) -> list[str]:
    """Categories whose memories are always shown (`context: all`) that the scope may read."""
    return [
        c.name
        for c in categories.all()
        if c.context == "all" and (scope.categories is None or c.name in scope.categories)
    ]


def _always_shown(
    retriever: Retriever,
    message: str,
    filters: SearchFilters,
    always: list[str],
    now: datetime | None,
) -> list[str]:
    """The `context: all` memories in scope, whatever their relevance, most relevant first."""
    if not always:
        return []
    result = retriever.retrieve(
        message, top_k=ALWAYS_LIMIT, filters=replace(filters, category=always), threshold=0.0,
        now=now,
    )  # fmt: skip
    return [_candidate_line(c) for c in result.items if not c.superseded]


def _memory_lines(
    always: list[str], result: RetrievalResult, categories: CategoryConfig
) -> list[str]:
    """Always-shown memories, then the ranked ones; at most `rag_length` per rag category."""
    lines = list(always)
    shown: dict[str, int] = {}
    for candidate in result.items:
        if candidate.superseded:
            continue  # what a newer statement overruled is not current: never shown as such
        line = _candidate_line(candidate)
        name = candidate.hit.category or categories.uncategorized or ""
        limit = _rag_length(categories, name)
        if line in lines or (limit is not None and shown.get(name, 0) >= limit):
            continue
        shown[name] = shown.get(name, 0) + 1
        lines.append(line)
    return lines


def _rag_length(categories: CategoryConfig, name: str) -> int | None:
    known = {c.name for c in categories.all()}
    return categories.get(name).rag_length if name in known else None


def _candidate_line(candidate: Candidate) -> str:
    hit = candidate.hit
    return f"[{_label(hit.category, hit.role, hit.kind)}] {_one_line(candidate.text)}"


def _label(category: str | None, role: str | None, kind: str) -> str:
    return category or role or kind


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class _StoredView:
    """The store's part of a block, read once per store version (DuckDB changes only when a
    pipeline writes it; live writes are laid over it at every call)."""

    users: int
    rev: int
    changes: StoredChanges
    reflections: list[dict[str, Any]]
    summary: Any


_stored_views: dict[tuple[Any, ...], _StoredView] = {}
_stored_views_lock = threading.Lock()


def _stored_view(settings: Settings, conversation_id: str, since_rev: int | None) -> _StoredView:
    """The store's revision, changes, reflections and summary for a conversation (cached by
    the store's signature: a short read-only connection costs tens of milliseconds)."""
    db_path = Path(settings.db_path)
    signature = store_signature(db_path)
    if signature is None:
        raise FileNotFoundError(f"no memory store at {db_path}")
    key = (str(resolved(db_path)), signature, conversation_id, since_rev)
    with _stored_views_lock:
        cached = _stored_views.get(key)
    if cached is not None:
        return cached
    with open_store(db_path, read_only=True, lock_timeout=0.0) as con:
        users = store_users(con)
        row = con.execute(
            "SELECT rev FROM conversation_revisions WHERE conversation_id = ?", [conversation_id]
        ).fetchone()
        rev = int(row[0]) if row else 0
        since = max(rev - DELTA_REVISIONS, 0) if since_rev is None else since_rev
        view = _StoredView(
            users=users,
            rev=rev,
            changes=stored_changes(con, since, conversation_id),
            reflections=fetch_dicts(
                con,
                "SELECT content, kind, user_id, conversation_id, session_id, category, "
                "attributes FROM memories WHERE kind = 'reflection' AND valid_until IS NULL "
                "AND state = 'active' ORDER BY created_at DESC, id DESC",
            ),
            summary=read_final_summary(con, conversation_id) if conversation_id else None,
        )
    with _stored_views_lock:
        for old in [k for k in _stored_views if k[0] == key[0] and k[1] != signature]:
            del _stored_views[old]
        _stored_views[key] = view
    return view


def _read_store(
    settings: Settings, scope: Scope, since_rev: int | None, notes: list[str]
) -> _StoreView | None:
    """Revision, delta header, final summary and latest reflection the scope may read; None if
    the store is busy."""
    conversation_id = scope.conversation_id or ""
    try:
        stored = _stored_view(settings, conversation_id, since_rev)
    except FileNotFoundError:
        notes.append("no store: no delta header, summary or reflection")
        return None
    except StoreLockedError:
        notes.append("store busy (a pipeline holds it): no delta header, summary or reflection")
        return None
    scope.check_store(stored.users)
    revisions = {conversation_id: stored.rev}
    live_changes(settings, stored.changes.folded, revisions, conversation_id)
    rev = revisions[conversation_id]
    since = max(rev - DELTA_REVISIONS, 0) if since_rev is None else since_rev
    delta = ""
    if rev > since:
        found = delta_of(
            settings, since, stored.changes, conversation_id=conversation_id, scope=scope
        )
        delta = found.header
    readable = scope.filter(stored.reflections, across_conversations=True)
    summary = stored.summary
    summary_row = {
        "kind": "summary",
        "user_id": None,
        "conversation_id": conversation_id,
        "attributes": {"source_categories": summary.source_categories} if summary else None,
    }
    return _StoreView(
        rev=rev,
        delta=delta,
        summary=summary.content if summary and scope.allows(summary_row) else None,
        reflection=readable[0]["content"] if readable else None,
    )


def _assemble(sections: list[_Section], budget: int) -> tuple[str, dict[str, int]]:
    """Add lines in order while the rendered block fits the budget (see the module doc)."""
    kept: dict[str, list[str]] = {s.name: [] for s in sections}

    def render() -> str:
        parts: list[str] = []
        for section in sections:
            if kept[section.name]:
                parts.extend([section.heading] if section.heading else [])
                parts.extend(kept[section.name])
        return "\n".join(parts)

    for section in sections:
        for line in section.lines:
            if section.cap is not None:
                line = _fit_cached(line, section.cap)
            kept[section.name].append(line)
            if count_tokens(render()) <= budget:
                continue
            kept[section.name].pop()
            if section.paragraph:
                _fit_paragraph(kept[section.name], line, render, budget)
            return render(), _counts(kept)
    return render(), _counts(kept)


@lru_cache(maxsize=64)
def _fit_cached(paragraph: str, cap: int) -> str:
    """`fit_tokens` of a capped paragraph (the conversation summary: the same text at every
    call until a pipeline writes a new one, tens of thousands of characters to encode)."""
    return fit_tokens(paragraph, cap)


def _counts(kept: dict[str, list[str]]) -> dict[str, int]:
    return {name: len(lines) for name, lines in kept.items() if lines}


def _fit_paragraph(
    target: list[str], paragraph: str, render: Callable[[], str], budget: int
) -> None:
    """Append the longest cut of `paragraph` (at least 8 tokens) that keeps the block in budget."""
    room = budget - count_tokens(render())
    for size in range(room, 7, -1):
        target.append(fit_tokens(paragraph, size))
        if count_tokens(render()) <= budget:
            return
        target.pop()
