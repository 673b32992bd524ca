"""`Memory`: the Python API of memory-dag, with the verbs people know from mem0.

    from memory_dag import Memory

    m = Memory()                                  # the embedded defaults (data/...)
    m.add([{"role": "user", "content": "I moved to Lisbon"}], user_id="sam")
    m.search("where does Sam live?", user_id="sam")

Every write is *live* (`memories/live_writer.py`): durable (fsynced in the workspace's journal)
and searchable from any process when the call returns, without the DuckDB write lock, so a
running pipeline never blocks or fails it; the next pipeline run folds it into the store
(`memories/fold.py`). Every read and write acts for one `Scope` (`memory_dag/scope.py`), built
from `user_id`, `agent_id` (the allowlist identity of `categories.yaml`), `run_id` (a session)
and `conversation_id`. The command line (`cli/`), the service (`service/`) and the MCP tools
call these methods.

`store()` is the one place that decides which store (DuckDB file, index, workspace) a request
uses.

(Over 500 lines on purpose: one method per verb of the public API, each with the docstring a
user reads; split, the API would be scattered.)
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memory_dag.compute_threads import limit_compute_threads
from memory_dag.config import Settings
from memory_dag.index.delta import delta_path
from memory_dag.index.published import IndexNotBuiltError, current_version
from memory_dag.index.search import get_searcher
from memory_dag.llm import LLMClient
from memory_dag.memories.agent_ops import change_on, correct_on, remember_on
from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.journal import pending_history
from memory_dag.memories.live_turns import record_messages
from memory_dag.memories.live_writer import LiveStore, LiveView
from memory_dag.memories.lookups import memory_history, user_export
from memory_dag.memories.transcripts import (
    DEFAULT_IDLE_SECONDS,
    SessionState,
    normalise_messages,
    session_key,
)
from memory_dag.memories.write_path import llm_client
from memory_dag.memories.writer import MemoryOpError
from memory_dag.memory_results import (
    AddResult,
    ChangeResult,
    ContextResult,
    HistoryEvent,
    HistoryResult,
    MemoryEvent,
    MemoryItem,
    MemoryList,
    SearchResults,
)
from memory_dag.paths import resolved
from memory_dag.read.context_block import build_context
from memory_dag.read.query import MemoryQuery, MemoryQueryResponse, query_memory
from memory_dag.read.retriever import RetrievalConfig, Retriever
from memory_dag.scope import Scope
from memory_dag.store.connection import StoreLockedError
from memory_dag.store.shards import settings_for

#: Seconds a read that needs the DuckDB file (history, export) waits for a pipeline's lock.
READ_WAIT_SECONDS = 10.0
#: Largest `metadata` a write takes (as JSON).
MAX_METADATA_BYTES = 16_384
ACTOR = "live"


class Memory:
    """The memory of one deployment: `add`, `search`, `get`, `get_all`, `update`, `delete`,
    `history`, `context`, `query` (and `restore`, `confirm`, `export`).

    `Memory()` reads `MEMORY_DAG_*` settings (embedded defaults otherwise); `Memory(path=...)`
    keeps a store in one folder (`workspace/`, `memory.duckdb`, `index/`); `Memory(settings)`
    takes settings. `llm` extracts and reconciles facts (default: the configured LLM, else the
    rules).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        path: str | Path | None = None,
        llm: LLMClient | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        retrieval: RetrievalConfig | None = None,
    ) -> None:
        if settings is None:
            folder = Path(path) if path is not None else None
            settings = (
                Settings.load(workspace=folder / "workspace", db_path=folder / "memory.duckdb")
                if folder is not None
                else Settings.load()
            )
        self.settings = settings
        limit_compute_threads(settings.compute_threads)  # reads: one thread each (see there)
        self.llm = llm if llm is not None else llm_client(settings)
        self.idle_seconds = idle_seconds
        self.retrieval = retrieval or RetrievalConfig()
        self._live: dict[Path, LiveStore] = {}
        self._retrievers: dict[Path, Retriever] = {}
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- where a request goes

    def store(self, user_id: str | None = None) -> Settings:
        """The store (settings: DuckDB file, index, workspace) a request for `user_id` uses:
        the one store, or in a sharded store (MEMORY_DAG_SHARDS > 1) the shard holding the
        user (`store/shards.py`; a request without a user is refused there, `RouteRequired`)."""
        return settings_for(self.settings, user_id=user_id)

    def _live_store(self, settings: Settings) -> LiveStore:
        key = resolved(settings.index_dir)
        with self._lock:
            if key not in self._live:
                self._live[key] = LiveStore(settings)
            return self._live[key]

    def _retriever(self, settings: Settings) -> Retriever:
        key = resolved(settings.index_dir)
        with self._lock:
            if key not in self._retrievers:
                self._retrievers[key] = Retriever(settings, self.retrieval)
            return self._retrievers[key]

    @staticmethod
    def scope(
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        conversation_id: str | None = None,
        categories: Sequence[str] | None = None,
    ) -> Scope:
        """The scope of a request (`AccessDenied` for an unknown agent or category)."""
        return Scope.of(
            user_id=user_id,
            agent=agent_id,
            run_id=run_id,
            conversation_id=conversation_id,
            categories=categories,
        )

    # ----------------------------------------------------------------- writes

    def add(
        self,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        conversation_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        category: str | None = None,
        importance: int | None = None,
        now: datetime | None = None,
    ) -> AddResult:
        """Remember a text, or record messages and learn from them.

        A string is stored as a memory as given (1-2 third-person sentences, seed 003 §9; a
        near-duplicate of the owner's facts is not stored twice: event NONE). Messages
        (`[{"role": "user" | "assistant", "content": ..., "name"?: ...}]`) are appended to the
        conversation's transcript (session `run_id`, else the current one: a new session
        closes the previous one) and, with `infer`, the facts of the user turns are extracted
        and reconciled with the owner's facts (ADD / UPDATE / DELETE / NONE, seed 000 §4).
        """
        scope = self.scope(
            user_id=user_id, agent_id=agent_id, run_id=run_id, conversation_id=conversation_id
        )
        attributes = _metadata(metadata)
        live = self._live_store(self.store(user_id))
        if isinstance(messages, str):
            with live.writer(actor=ACTOR, scope=scope, now=now) as writer:
                result = remember_on(
                    writer, messages, scope=scope, category=category, importance=importance,
                    now=now, attributes=attributes,
                )  # fmt: skip
            where = {"conversation_id": scope.conversation_id, "run_id": scope.run_id}
            if result.status == "duplicate":
                same = writer.get(result.memory_id)
                text = same["content"] if same else messages
                event = MemoryEvent(id=result.memory_id, memory=text, event="NONE")
                return AddResult(results=[event], **where)
            return AddResult(results=_events(writer.events), **where)
        turns = normalise_messages(messages)
        if attributes:
            turns = [{**turn, **attributes} for turn in turns]
        recorded = record_messages(
            live, turns, scope, llm=self.llm if infer else None, infer=infer,
            at=now or datetime.now(UTC), idle_seconds=self.idle_seconds, actor=ACTOR,
        )  # fmt: skip
        return AddResult(
            results=_events(recorded.events),
            turns=recorded.turns,
            conversation_id=scope.conversation_id,
            run_id=recorded.session_id,
            closed_run_id=recorded.closed,
        )

    def update(self, memory_id: str, text: str, **scope: Any) -> ChangeResult:
        """Replace a memory with a corrected text; the new memory has a new id (`id`).
        `scope`: user_id, agent_id, conversation_id (and `now`), as for every write."""
        result = self._write(lambda w, s: correct_on(w, memory_id, text, scope=s), **scope)
        return ChangeResult(status=result.status, id=result.memory_id, replaced_id=memory_id)

    def delete(self, memory_id: str, **scope: Any) -> ChangeResult:
        """Forget a memory: it leaves every read at once; purged after 30 days unless restored."""
        return self._change(memory_id, "forgotten", **scope)

    def restore(self, memory_id: str, **scope: Any) -> ChangeResult:
        """Bring back a forgotten (or contradicted, expired) memory."""
        return self._change(memory_id, "restored", **scope)

    def confirm(self, memory_id: str, **scope: Any) -> ChangeResult:
        """Protect a memory from decay."""
        return self._change(memory_id, "confirmed", **scope)

    def _change(self, memory_id: str, status: str, **scope: Any) -> ChangeResult:
        result = self._write(lambda w, s: change_on(w, memory_id, status, scope=s), **scope)
        return ChangeResult(status=result.status, id=result.memory_id)

    def _write(
        self,
        action: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        conversation_id: str | None = None,
        now: datetime | None = None,
    ) -> Any:
        """Run `action(writer, scope)` as one live write (durable and searchable on return)."""
        scope = self.scope(user_id=user_id, agent_id=agent_id, conversation_id=conversation_id)
        live = self._live_store(self.store(user_id))
        with live.writer(actor=ACTOR, scope=scope, now=now) as writer:
            return action(writer, scope)

    # ----------------------------------------------------------------- reads

    def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        conversation_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        min_score: float | None = None,
    ) -> SearchResults:
        """The memories most relevant to `query` that the scope may read, best first.

        `filters` narrow the scope (kind, category, role, speaker, agent_id, importance_min,
        importance_max, pinned, updated_after, updated_before, source, path); they never widen
        it. `min_score` is the least relevance (default 0.35); `limit` the number of results.
        """
        scope = self.scope(
            user_id=user_id, agent_id=agent_id, run_id=run_id, conversation_id=conversation_id
        )
        settings = self.store(user_id)
        if not _anything(settings):  # nothing built or written yet
            return SearchResults(query=query, results=[])
        retriever = self._retriever(settings)
        searcher = retriever.searcher
        scope.check_store(searcher.store_users())
        wanted = scope.narrow(scope.search_filters(searcher.kinds()), filters)
        result = retriever.retrieve(
            query,
            top_k=limit if limit is not None else settings.max_results,
            filters=wanted,
            threshold=min_score,
        )
        found = [MemoryItem.from_candidate(c) for c in result.items]
        return SearchResults(query=query, results=found, stages=result.ran())

    def get(
        self,
        memory_id: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        conversation_id: str | None = None,
    ) -> MemoryItem | None:
        """One memory by id, in any state; None when there is none (AccessDenied when the scope
        may not read it)."""
        scope = self.scope(user_id=user_id, agent_id=agent_id, conversation_id=conversation_id)
        settings = self.store(user_id)
        view = self._view(settings)
        if view is not None:
            scope.check_store(view.searcher.store_users())
        row = view.get(memory_id) if view is not None else None
        if row is None:
            row = self._stored(settings, memory_id, scope)
        if row is None:
            return None
        scope.check_target(row)
        return MemoryItem.from_row(row)

    def get_all(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        conversation_id: str | None = None,
        limit: int = 100,
    ) -> MemoryList:
        """The scope's active memories (facts, summaries, ...; not transcript turns), newest
        first."""
        scope = self.scope(
            user_id=user_id, agent_id=agent_id, run_id=run_id, conversation_id=conversation_id
        )
        view = self._view(self.store(user_id))
        if view is None:  # nothing built or written yet
            return MemoryList(results=[])
        scope.check_store(view.searcher.store_users())
        rows = [
            row
            for row in view.memories()
            if row["state"] == "active" and row["valid_until"] is None and scope.allows(row)
        ]
        rows.sort(key=lambda r: (_time(r["created_at"]), r["id"]), reverse=True)
        return MemoryList(results=[MemoryItem.from_row(row) for row in rows[:limit]])

    def history(
        self,
        memory_id: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        conversation_id: str | None = None,
    ) -> HistoryResult:
        """A memory and its audit trail: the store's history, then live writes not folded yet
        (`pending`). Waits up to `READ_WAIT_SECONDS` for a pipeline holding the store."""
        scope = self.scope(user_id=user_id, agent_id=agent_id, conversation_id=conversation_id)
        settings = self.store(user_id)
        stored: dict[str, Any] = {"memory": None, "history": [], "journal_seq": 0}
        if Path(settings.db_path).exists():
            with contextlib.suppress(MemoryOpError):  # not in the store yet: a live write
                stored = memory_history(
                    settings, memory_id, scope=scope, lock_timeout=READ_WAIT_SECONDS
                )
        view = self._view(settings)
        row = (view.get(memory_id) if view is not None else None) or stored["memory"]
        if row is None:
            raise MemoryOpError(f"no memory {memory_id}")
        scope.check_target(row)
        events = [HistoryEvent(at=e.pop("ts"), **e) for e in stored["history"]]
        events += _pending(settings, {memory_id}, int(stored["journal_seq"]))
        return HistoryResult(memory=MemoryItem.from_row(row), events=events)

    def context(
        self,
        query: str,
        *,
        conversation_id: str,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        exclude_run_id: str | None = None,
        limit: int | None = None,
        max_tokens: int | None = None,
        min_score: float | None = None,
        since_rev: int | None = None,
    ) -> ContextResult:
        """The block to inject before an agent answers `query` in a conversation: delta
        header, summary, relevant memories, related ones, weekly reflection (seed 000 §3).
        `exclude_run_id` leaves out the current session (seed 004)."""
        scope = self.scope(
            user_id=user_id, agent_id=agent_id, run_id=run_id, conversation_id=conversation_id
        )
        settings = self.store(user_id)
        limits = {"max_memories": limit, "max_tokens": max_tokens, "min_score": min_score}
        if not _anything(settings):  # nothing built or written yet: nothing to inject
            return ContextResult(text="", tokens=0, max_tokens=max_tokens or 0, rev=None)
        block = build_context(
            query,
            scope,
            settings=settings,
            since_rev=since_rev,
            exclude_session=exclude_run_id,
            retriever=self._retriever(settings),
            **{name: value for name, value in limits.items() if value is not None},
        )
        return ContextResult(**block.to_dict())

    def query(
        self,
        query: str,
        *,
        agent_id: str,
        categories: Sequence[str] | None = None,
        filters: Mapping[str, Any] | None = None,
        user_id: str | None = None,
        conversation_id: str | None = None,
        limit: int = 5,
        max_tokens: int | None = None,
        min_score: float | None = None,
        return_: str = "bullets",
    ) -> MemoryQueryResponse:
        """memory.query (seed 003 §6): what `agent_id` may read, as bullets or full records,
        within `max_tokens`; categories outside its allowlist are `AccessDenied`."""
        request = MemoryQuery.model_validate(
            {
                "agent": agent_id,
                "query": query,
                "categories": list(categories) if categories is not None else None,
                "filters": dict(filters or {}),
                "top_k": limit,
                "return": return_,
                "budget_tokens": max_tokens,
                "threshold": min_score,
            }
        )
        caller = Scope.of(user_id=user_id, agent=agent_id, conversation_id=conversation_id)
        settings = self.store(user_id)
        return query_memory(
            request, scope=caller, settings=settings, retriever=self._retriever(settings)
        )

    def refresh(self, *, user_id: str | None = None) -> None:
        """Lay the live writes made since over this process's view of the user's store now
        (`delta.current_overlay`), so that the next read does not: the proxy's learner calls
        it after a turn, off the requests' path (extending costs ~2 ms a write at 100k)."""
        settings = self.store(user_id)
        if not _anything(settings):
            return
        try:
            self._retriever(settings).searcher.overlay()
        except IndexNotBuiltError:
            return

    def current_run(
        self,
        *,
        conversation_id: str | None,
        user_id: str | None = None,
        idle_seconds: float | None = None,
        now: datetime | None = None,
    ) -> str:
        """The session a write for this conversation (or user) would go to now: the current
        one, or a new one after `idle_seconds` without a turn (default: this memory's)."""
        settings = self.store(user_id)
        idle = self.idle_seconds if idle_seconds is None else idle_seconds
        state = SessionState(Path(settings.workspace))
        key = session_key(conversation_id, user_id)
        choice = state.choose(key, None, now or datetime.now(UTC), idle)
        return choice.session_id

    def export(self, *, user_id: str, agent_id: str | None = None) -> Iterator[dict[str, Any]]:
        """A user's memories and their history as JSON-ready dicts (`{"type": "memory" |
        "history", ...}`), live writes not folded yet included (`pending`)."""
        scope = self.scope(user_id=user_id, agent_id=agent_id)
        settings = self.store(user_id)
        stored: dict[str, Any] = {"memories": [], "history": [], "journal_seq": 0}
        if Path(settings.db_path).exists():
            stored = user_export(settings, scope, lock_timeout=READ_WAIT_SECONDS)
        view = self._view(settings)
        live = view.overlay.memories if view is not None else {}
        rows = {row["id"]: row for row in stored["memories"]}
        for memory_id, row in live.items():
            if row.get("kind") != "episode" and scope.allows(row, across_conversations=True):
                rows[memory_id] = {**row, "pending": True}
        for row in rows.values():
            item = MemoryItem.from_row(row).to_dict()
            yield {"type": "memory", **item, "pending": bool(row.get("pending"))}
        for event in stored["history"]:
            event.pop("id", None)
            yield {"type": "history", **HistoryEvent(at=event.pop("ts"), **event).to_dict()}
        for event in _pending(settings, set(rows), int(stored["journal_seq"])):
            yield {"type": "history", **event.to_dict()}

    # ----------------------------------------------------------------- internals

    def _view(self, settings: Settings) -> LiveView | None:
        """The live view of a store (None before anything was built or written)."""
        try:
            return LiveView(get_searcher(settings))
        except IndexNotBuiltError:
            return None

    @staticmethod
    def _stored(settings: Settings, memory_id: str, scope: Scope) -> dict[str, Any] | None:
        """A memory only the store knows (a transcript turn): None when it has none."""
        if not Path(settings.db_path).exists():
            return None
        try:
            return memory_history(settings, memory_id, scope=scope, lock_timeout=READ_WAIT_SECONDS)[
                "memory"
            ]
        except MemoryOpError:
            return None


# --------------------------------------------------------------------------- helpers


def _anything(settings: Settings) -> bool:
    """Whether a store has an index or live writes to read (else every read is empty)."""
    index_dir = Path(settings.index_dir)
    return current_version(index_dir) is not None or delta_path(index_dir).exists()


def _pending(settings: Settings, memory_ids: set[str], folded: int) -> list[HistoryEvent]:
    """Live writes about these memories the store has not folded yet, as history events."""
    rows = pending_history(Path(settings.workspace), memory_ids, folded)
    return [HistoryEvent(pending=True, **row) for row in rows]


def _metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise ValueError("metadata must be an object")
    encoded = json.dumps(dict(metadata), ensure_ascii=False, default=str)
    if len(encoded.encode("utf-8")) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is larger than {MAX_METADATA_BYTES} bytes")
    return {"metadata": json.loads(encoded)}


def _events(events: list[tuple[str, str, str, str | None]]) -> list[MemoryEvent]:
    return [
        MemoryEvent(id=memory_id, memory=text, event=event, previous_id=previous)  # type: ignore[arg-type]
        for event, memory_id, text, previous in events
    ]


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if value:
        return _time(datetime.fromisoformat(str(value)))
    return datetime.min.replace(tzinfo=UTC)


__all__ = ["AccessDenied", "Memory", "StoreLockedError"]
