"""The scope boundary: who asks, for what, and the one place that decides what they may see.

Every read and every write of a memory passes here: search and the retriever's candidates,
memory.query, the context block and its delta header, related bullets, the weekly reflection,
export, entity and history lookups, `remember` and the other agent operations, reconciliation,
relations and dedup merges. Build a scope with `Scope.of(...)` (it resolves the agent's
allowlist from `categories.yaml`) and pass it down; nothing below builds its own filters.

Ownership (what a memory belongs to):

* A memory with a `user_id` is *owned* by that user: only a scope of that user reads it.
* A memory without one is *shared* by its conversation. Transcript turns are always shared:
  everybody in a conversation heard them, whatever `user_id` a transcript line carries (that
  user owns the facts drawn from the turn, not the turn). A scope with a user reads shared
  memories only of the conversation it names; a user asking without a conversation reads
  its own memories and nothing shared.
* Writers group memories by *owner* (`owner_key`): the user when there is one, else the
  conversation. Dedup of `remember`, reconciliation neighbours, relations and dedup merges
  never leave their owner, so they never cross users.

Fail closed: a store is *scoped* when its memories name more than one user. Every read or
write of a scoped store needs a user (`ScopeRequired`, not everything). A store of one user
(or none, like the sample workspace) may be read without one: there is nobody to cross.

Categories: an agent reads the categories of its allowlist (`procedural` only when it names
it, seed 003 §12); rows without a category (turns, notes) read as the `uncategorized` one.
A summary or reflection has no category of its own: it is readable when every category it was
made from is (`attributes.source_categories`), so it never carries a fact past an allowlist.
A write names a known category or none (`check_category`; `UnknownCategory` lists them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memory_dag.memories.categories import (
    PROCEDURAL,
    AccessDenied,
    CategoryConfig,
    load_categories,
)

if TYPE_CHECKING:  # index/search.py reads through a Scope: imported when filters are made
    from memory_dag.index.search import SearchFilters

#: Kinds that summarise other memories and carry no category of their own.
DERIVED_KINDS = ("summary", "reflection")
#: Memories of these kinds belong to their conversation, whatever user they name.
SHARED_KINDS = ("episode",)
#: A store whose memories name more users than this is scoped (reads need a user).
UNSCOPED_MAX_USERS = 1


class ScopeRequired(AccessDenied):
    """A scoped store (memories of several users) was asked without a user."""


class UnknownCategory(ValueError):
    """A write named a category that `categories.yaml` does not define."""


def store_users_sql() -> str:
    """SQL counting the distinct users the store's memories name (any state)."""
    return "SELECT count(DISTINCT user_id) FROM memories WHERE user_id IS NOT NULL"


def owner_key(user_id: str | None, conversation_id: str | None) -> str:
    """The owner of a memory: `user:<id>` when it has a user, else `conversation:<id>`."""
    if user_id is not None:
        return f"user:{user_id}"
    return f"conversation:{conversation_id or ''}"


#: `owner_key` in SQL, over the columns of `memories`.
OWNER_SQL = (
    "CASE WHEN user_id IS NOT NULL THEN 'user:' || user_id "
    "ELSE 'conversation:' || coalesce(conversation_id, '') END"
)


def owner_of(key: str) -> tuple[str | None, str | None]:
    """(user_id, conversation_id) of an `owner_key`."""
    kind, _, value = key.partition(":")
    if kind == "user":
        return value, None
    return None, value or None


def owner_where(key: str) -> tuple[str, list[Any]]:
    """SQL condition and parameters selecting the memories of one owner."""
    user_id, conversation_id = owner_of(key)
    if user_id is not None:
        return "user_id = ?", [user_id]
    return "user_id IS NULL AND coalesce(conversation_id, '') = ?", [conversation_id or ""]


def check_category(name: str | None, config: CategoryConfig | None = None) -> str | None:
    """`name` if `categories.yaml` defines it (None passes: uncategorised), else UnknownCategory."""
    if name is None:
        return None
    config = config or load_categories()
    known = sorted(c.name for c in config.all())
    if name not in known:
        raise UnknownCategory(f"unknown category {name!r}; known categories: {', '.join(known)}")
    return name


#: What a row without a category reads as when the categories file names no `uncategorized`:
#: no allowlist holds it, so agents never read such rows (operators without an agent do).
NO_CATEGORY = "(uncategorized)"


def read_as(category: str | None, config: CategoryConfig | None = None) -> str:
    """The category a row is read as: its own, else the file's `uncategorized` one."""
    if category is not None:
        return category
    config = config or load_categories()
    return config.uncategorized or NO_CATEGORY


def known_category(name: str | None, config: CategoryConfig | None = None) -> str | None:
    """`name` if defined, else None (for guessed categories, which may not exist in a custom
    categories file: the memory is then uncategorised rather than refused)."""
    config = config or load_categories()
    return name if name in {c.name for c in config.all()} else None


@dataclass(frozen=True)
class Scope:
    """Who is asking (user, agent) and for what (conversation, run, categories).

    `categories` is what may be read: the agent's allowlist, or the categories asked for
    within it; None reads every category (an operator without an agent). `procedural` says
    whether procedural memories were asked for by name. Build it with `Scope.of`.
    """

    user_id: str | None = None
    agent: str | None = None
    run_id: str | None = None
    conversation_id: str | None = None
    categories: frozenset[str] | None = None
    procedural: bool = False
    uncategorized: str | None = None

    # ----------------------------------------------------------------- building

    @classmethod
    def of(
        cls,
        *,
        user_id: str | None = None,
        agent: str | None = None,
        run_id: str | None = None,
        conversation_id: str | None = None,
        categories: Iterable[str] | None = None,
        config: CategoryConfig | None = None,
    ) -> Scope:
        """The scope of a request; `categories` are the ones asked for (default: all the agent
        may read). AccessDenied for an unknown agent or a category outside its allowlist."""
        config = config or load_categories()
        requested = list(dict.fromkeys(categories)) if categories else None
        if agent is not None:
            readable: list[str] | None = config.resolve(agent, requested)
        elif requested is not None:
            known = {c.name for c in config.all()}
            unknown = [c for c in requested if c not in known]
            if unknown:
                raise AccessDenied(
                    f"unknown categories {unknown} (defined: {', '.join(sorted(known))})"
                )
            readable = requested
        else:
            readable = None
        return cls(
            user_id=_blank_to_none(user_id),
            agent=agent,
            run_id=_blank_to_none(run_id),
            conversation_id=_blank_to_none(conversation_id),
            categories=frozenset(readable) if readable is not None else None,
            procedural=bool(requested) and PROCEDURAL in (requested or []),
            uncategorized=config.uncategorized,
        )

    def in_conversation(self, conversation_id: str | None) -> Scope:
        """This scope naming `conversation_id` (asking for its shared memories too)."""
        return replace(self, conversation_id=_blank_to_none(conversation_id))

    # ----------------------------------------------------------------- the store

    def check_store(self, users: int) -> None:
        """Fail closed: ScopeRequired when the store names more than one user and this scope
        names none. `users` is the count of distinct users (`store_users`)."""
        if self.user_id is None and users > UNSCOPED_MAX_USERS:
            raise ScopeRequired(
                f"this store holds memories of {users} users: a read or write needs a user "
                "(--user, or user_id=)"
            )

    def check_connection(self, con: Any) -> None:
        """`check_store` with the user count read on an open connection."""
        self.check_store(store_users(con))

    # ----------------------------------------------------------------- rows

    def allows(self, row: Mapping[str, Any], *, across_conversations: bool = False) -> bool:
        """Whether this scope may read a memory row (a dict with the `memories` columns it
        has: user_id, conversation_id, session_id, kind, category, attributes).

        `across_conversations`: the scope's own memories (and, without a user, memories of no
        conversation) count whatever their conversation (the weekly reflection is per user).
        Call `check_store` first: without a user this admits every owner.
        """
        kind = row.get("kind")
        owner = None if kind in SHARED_KINDS else row.get("user_id")
        conversation = row.get("conversation_id")
        named = self.conversation_id
        if owner is not None:
            if self.user_id is not None and owner != self.user_id:
                return False
            if named is not None and conversation != named and not across_conversations:
                return False
        else:
            if self.user_id is not None and (named is None or conversation != named):
                return False
            elsewhere = named is not None and conversation != named
            if elsewhere and not (across_conversations and conversation is None):
                return False
        if self.run_id is not None and row.get("session_id") != self.run_id:
            return False
        return self._allows_category(kind, row.get("category"), row.get("attributes"))

    def _allows_category(self, kind: Any, category: Any, attributes: Any) -> bool:
        if kind == "procedural" or category == PROCEDURAL:
            return self.procedural and (self.categories is None or PROCEDURAL in self.categories)
        if self.categories is None:
            return True
        if kind in DERIVED_KINDS:
            sources = source_categories(attributes)
            return sources is not None and sources <= self.categories
        return (category or self.uncategorized) in self.categories

    def filter(
        self, rows: Iterable[Mapping[str, Any]], *, across_conversations: bool = False
    ) -> list[Any]:
        """The rows this scope may read, in order."""
        return [r for r in rows if self.allows(r, across_conversations=across_conversations)]

    # ----------------------------------------------------------------- the index

    def search_filters(self, kinds: Iterable[str], *, exclude: Iterable[str] = ()) -> SearchFilters:
        """Index filters that admit exactly the rows `allows` admits, applied before ranking.

        `kinds` are the kinds the index holds; `exclude` kinds the caller shows elsewhere (the
        context block's summary and reflection). Derived kinds without a category are left out
        for an agent: the index cannot check their sources (the context block does).
        """
        from memory_dag.index.search import SearchFilters

        left_out = set(exclude)
        if not self.procedural:
            left_out.add(PROCEDURAL)
        if self.categories is not None:
            left_out.update(DERIVED_KINDS)
        readable = [k for k in kinds if k not in left_out]
        users: list[str | None] | None = None
        if self.user_id is not None:
            users = [self.user_id] + ([None] if self.conversation_id is not None else [])
        categories: list[str | None] | None = None
        if self.categories is not None:
            categories = sorted(self.categories)
            if self.uncategorized in self.categories:
                categories.append(None)  # turns and notes read as `uncategorized`
        return SearchFilters(
            conversation=self.conversation_id,
            session=self.run_id,
            user_id=users,  # type: ignore[arg-type]  # None selects shared rows
            category=categories,  # type: ignore[arg-type]  # None selects uncategorised rows
            kind=readable,
        )

    def narrow(self, filters: SearchFilters, requested: Mapping[str, Any] | None) -> SearchFilters:
        """`filters` (this scope's) narrowed by a request's own filters, never widened.

        The request may name kind, category, role, speaker, agent_id, source, path,
        importance_min/max, pinned, updated_after/before. A kind or category it names that
        the scope may not read is left out (a category outside the agent's allowlist is
        AccessDenied); user, run and conversation are the scope's, never a filter's.
        """
        from memory_dag.index.search import SearchFilters as Filters

        given = dict(requested or {})
        unknown = sorted(set(given) - set(NARROWING_FILTERS))
        if unknown:
            raise AccessDenied(
                f"unknown or scope filters {unknown}: filters take "
                f"{', '.join(NARROWING_FILTERS)}; user, run and conversation are the caller's"
            )
        changes: dict[str, Any] = {}
        for key in ("kind", "category"):
            if key in given:
                wanted = _as_list(given.pop(key))
                if key == "category" and self.categories is not None:
                    denied = sorted(set(wanted) - self.categories)
                    if denied:
                        raise AccessDenied(f"the caller may not read categories {denied}")
                allowed = getattr(filters, key)
                changes[key] = [v for v in wanted if allowed is None or v in _as_list(allowed)]
        for key in ("role", "speaker", "agent_id", "source"):
            if key in given:
                changes[key] = _as_list(given.pop(key))
        for key in ("updated_after", "updated_before"):
            if given.get(key) is not None:
                changes[key] = _as_time(given.pop(key))
        for key in ("importance_min", "importance_max"):
            if given.get(key) is not None:
                changes[key] = int(given.pop(key))
        if given.get("pinned") is not None:
            pinned = given.pop("pinned")
            changes["pinned"] = pinned if isinstance(pinned, bool) else str(pinned) in TRUE
        if given.get("path") is not None:
            changes["path"] = str(given.pop("path"))
        return replace(filters, **changes) if isinstance(filters, Filters) else filters

    # ----------------------------------------------------------------- writes

    def check_target(self, row: Mapping[str, Any]) -> None:
        """AccessDenied unless this scope may act on the one memory `row` (change it, read its
        history): its user's, or shared in the named conversation, and of a category the agent
        may read (any run; a procedure named by its id counts as asked for)."""
        writer = replace(self, run_id=None, procedural=True)
        if not writer.allows(row, across_conversations=True):
            category = row.get("category") or self.uncategorized
            raise AccessDenied(
                f"{row.get('id')} is outside this scope (user {self.user_id!r}, conversation "
                f"{self.conversation_id!r}, agent {self.agent!r}; its category {category!r})"
            )


#: Filters a request may add to its scope's (`Scope.narrow`).
NARROWING_FILTERS = (
    "kind", "category", "role", "speaker", "agent_id", "source", "path", "importance_min",
    "importance_max", "pinned", "updated_after", "updated_before",
)  # fmt: skip


TRUE = ("1", "true", "True", "yes")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _as_time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError as error:
        raise ValueError(f"not a time: {value!r} (use ISO 8601)") from error


def store_users(con: Any) -> int:
    """Distinct users named by the store's memories (any state)."""
    return int(con.execute(store_users_sql()).fetchone()[0])


def source_categories(attributes: Any) -> frozenset[str] | None:
    """The categories a summary or reflection was made from (None when not recorded)."""
    if attributes is None:
        return None
    data = json.loads(attributes) if isinstance(attributes, str) else attributes
    values = data.get("source_categories") if isinstance(data, dict) else None
    return frozenset(values) if isinstance(values, list) else None


def _blank_to_none(value: str | None) -> str | None:
    return value if value is not None and value.strip() else None
