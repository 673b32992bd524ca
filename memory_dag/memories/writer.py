"""Every write to the memory store goes through `MemoryWriter`; the agent's operations too.

One writer, so the write path, the agent's commands and the maintenance jobs all leave the same
trail. Inside `with writer.transaction():` each write:

* changes `memories` (an insert, or a soft delete: `valid_until`, `state = 'soft_deleted'`;
  rows are never removed here);
* records a `history` row and a `change_log` row under the conversation's next revision
  (`history.py`);
* for a new fact: caches its embedding under the search key (`embed/cache.py`), so the embed
  stage does not redo it, queues its entity links (`entity_links.py`), and queues `related_to`
  edges to its most similar active facts of the same conversation (`relations.py`).

Those rows, the new memories and the events are buffered and written in bulk: a DuckDB
statement costs about a millisecond, one per row would dominate a consolidation run. New
memories are written before anything reads or updates `memories` (`writer.con` flushes them
first), so a transaction always sees its own writes.

* `restore` refuses a memory that was replaced by a correction or an update while the replacement
  is active: two versions of one fact would both be served. Forget the replacement first.
* Facts are grouped by owner (`scope.owner_key`: the user, else the conversation): the
  neighbours a new fact is related to never belong to another user. A memory's category must
  be defined in `categories.yaml` (`scope.check_category`).
* `now` fixes the writer's clock (the maintenance jobs' and the tests' clocks); each stamp is a
  microsecond after the previous one, so rows written in one transaction keep their order.

Why one module of ~530 lines: it is `MemoryWriter`'s one public surface; its parts already live
with their concepts (`history.py`, `change_log.py`, `embed/cache.py`, `entity_links.py`,
`relations.py`); what stays is the buffered bulk write every call shares.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from memory_dag.embed.cache import VectorCache
from memory_dag.embed.providers import EmbeddingProvider
from memory_dag.ids import random_id
from memory_dag.memories.categories import CategoryConfig, load_categories
from memory_dag.memories.entity_links import EntityLinker
from memory_dag.memories.history import HistoryLog
from memory_dag.memories.relations import LINK_MIN, LINK_TOP_K, FactSet, related_edges, write_edges
from memory_dag.scope import OWNER_SQL, check_category, owner_key
from memory_dag.store.connection import fetch_dicts, insert_arrow, listed, to_json

#: Facts decay by default (seed 004); `confirm` sets the rate to 0.
FACT_DECAY_RATE = 0.1

_ID_PREFIX = {"fact": "fact_", "summary": "sum_", "reflection": "ref_", "insight": "ins_"}

_TS = pa.timestamp("us", tz="UTC")
#: The columns a new memory is written with (the rest take their defaults).
_MEMORY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("kind", pa.string()),
        ("content", pa.string()),
        ("conversation_id", pa.string()),
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("agent_id", pa.string()),
        ("source_role", pa.string()),
        ("speaker", pa.string()),
        ("event_time", _TS),
        ("created_at", _TS),
        ("confidence", pa.float64()),
        ("importance", pa.int32()),
        ("category", pa.string()),
        ("decay_rate", pa.float64()),
        ("source_ids", pa.list_(pa.string())),
        ("tags", pa.list_(pa.string())),
        ("attributes", pa.string()),
        ("supersedes", pa.string()),
        ("valid_until", _TS),
        ("state", pa.string()),
        ("replaced_by", pa.string()),
        ("purge_at", _TS),
    ]
)
#: What `SELECT *` gives for the columns a new memory is not written with (their defaults).
_UNWRITTEN_COLUMNS: dict[str, Any] = {
    "turn_id": None,
    "path": None,
    "line": None,
    "pinned": False,
    "access_count": 0,
    "last_accessed": None,
}
_EVENT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("conversation_id", pa.string()),
        ("node", pa.string()),
        ("op", pa.string()),
        ("status", pa.string()),
        ("memory_id", pa.string()),
        ("detail", pa.string()),
        ("meta", pa.string()),
        ("ts", _TS),
    ]
)


class MemoryOpError(ValueError):
    """An operation that cannot be done as asked (unknown id, invalid text, wrong state)."""


def new_memory_id(kind: str) -> str:
    return random_id(_ID_PREFIX.get(kind, kind[:4] + "_"))


class Clock:
    """The wall clock, or a fixed time that moves one microsecond per reading (so rows stamped
    in one transaction keep their order)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start if start is None or start.tzinfo else start.replace(tzinfo=UTC)
        self._ticks = 0

    def __call__(self) -> datetime:
        if self._start is None:
            return datetime.now(UTC)
        self._ticks += 1
        return self._start + timedelta(microseconds=self._ticks)

    def move_to(self, moment: datetime) -> None:
        """Read `moment` from now on (a replayed live write keeps the time it was made at)."""
        self._start = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        self._ticks = 0


@dataclass
class NewMemory:
    """A memory about to be written (ids, times and state are the writer's business)."""

    content: str
    kind: str = "fact"
    conversation_id: str | None = None
    session_id: str | None = None
    speaker: str | None = None
    source_role: str | None = None
    category: str | None = None
    importance: int = 2
    event_time: datetime | None = None
    source_ids: list[str] = field(default_factory=list)
    user_id: str | None = None
    agent_id: str | None = None
    tags: list[str] = field(default_factory=list)
    decay_rate: float = FACT_DECAY_RATE
    confidence: float = 1.0
    attributes: dict[str, Any] | None = None


class MemoryWriter:
    """Writes memories with their history, change log, embeddings, entity links and relations.

    Bound to one open connection; every write happens inside `with writer.transaction():`.
    `counts` adds up what was written, for run metadata.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        provider: EmbeddingProvider,
        *,
        actor: str,
        link_top_k: int = LINK_TOP_K,
        link_min: float = LINK_MIN,
        now: datetime | None = None,
    ) -> None:
        self._con = con
        self.now = Clock(now)
        self.provider = provider
        self.actor = actor
        self.link_top_k = link_top_k
        self.link_min = link_min
        self.counts: dict[str, int] = {}
        self.relation_seconds = 0.0
        self._in_transaction = False
        self._fact_sets: dict[str, FactSet] = {}
        self._vectors = VectorCache(con, provider)
        self._log = HistoryLog(con, actor, guard=self._require_transaction, clock=self.now)
        #: One audit row: `history(memory_id, event, old_ref=, new_ref=, meta=)`.
        self.history = self._log.history
        #: A change-log row under the conversation's next revision; returns that revision.
        self.log_change = self._log.log_change
        #: Read the revision counters of conversations about to change, in one query.
        self.load_revisions = self._log.load_revisions
        self._entities = EntityLinker(con, self._count)
        self._pending_edges: list[dict[str, Any]] = []
        self._new_memories: dict[str, dict[str, Any]] = {}  # id -> row, in write order
        self._events: list[dict[str, Any]] = []
        #: `categories.yaml` as this transaction reads it (loaded once, not once a memory).
        self._categories: CategoryConfig | None = None

    @property
    def categories(self) -> CategoryConfig:
        """`categories.yaml` as this transaction reads it: loaded once (each load stats the
        file), not once a memory or a fact."""
        if self._categories is None:
            self._categories = load_categories()
        return self._categories

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The connection, with the memories written so far in it (buffered ones are flushed)."""
        self._flush_memories()
        return self._con

    # ----------------------------------------------------------------- transactions

    @contextmanager
    def transaction(self) -> Iterator[MemoryWriter]:
        """All-or-nothing writes. History, change-log, embedding, entity and edge rows are
        buffered and written in bulk before COMMIT (one statement each, not one per write)."""
        if self._in_transaction:
            raise RuntimeError("MemoryWriter transactions do not nest")
        self._con.execute("BEGIN TRANSACTION")
        self._in_transaction = True
        self._categories = None
        try:
            yield self
            self._flush()
            self._con.execute("COMMIT")
        except BaseException:
            self._con.execute("ROLLBACK")
            # In-memory views may hold rows that were rolled back: load them again when needed.
            self._fact_sets.clear()
            self._vectors.reset()
            self._log.reset()
            self._entities.reset()
            self._pending_edges.clear()
            self._new_memories.clear()
            self._events.clear()
            raise
        finally:
            self._in_transaction = False

    def _require_transaction(self) -> None:
        if not self._in_transaction:
            raise RuntimeError("MemoryWriter writes must run inside `with writer.transaction():`")

    def _count(self, key: str, amount: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    # ----------------------------------------------------------------- reading

    def get(self, memory_id: str) -> dict[str, Any] | None:
        buffered = self._new_memories.get(memory_id)
        if buffered is not None:  # written in this transaction, not flushed yet
            return {**_UNWRITTEN_COLUMNS, **buffered}
        rows = fetch_dicts(self.con, "SELECT * FROM memories WHERE id = ?", [memory_id])
        return rows[0] if rows else None

    def active(self, memory_id: str) -> dict[str, Any]:
        row = self.get(memory_id)
        if row is None:
            raise MemoryOpError(f"no memory {memory_id}")
        if row["valid_until"] is not None or row["state"] != "active":
            raise MemoryOpError(f"memory {memory_id} is not active (state {row['state']})")
        return row

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of `texts`, from the embedding cache when present; new ones are cached."""
        return self._vectors.embed(texts, defer=self._in_transaction)

    def facts(self, owner: str) -> FactSet:
        """The active facts of one owner (`scope.owner_key`: a user, else a conversation)."""
        if owner not in self._fact_sets:
            self.prefetch_facts([owner])
        return self._fact_sets[owner]

    def prefetch_facts(self, owners: Iterable[str]) -> None:
        """Load the active facts of these owners (`scope.owner_key`) with one query."""
        keys = sorted(set(owners) - self._fact_sets.keys())
        if not keys:
            return
        found: dict[str, list[tuple[str, str]]] = {key: [] for key in keys}
        con = self.con
        with listed(con, "_owners", keys):
            rows = con.execute(
                f"SELECT {OWNER_SQL}, id, content FROM facts "
                f"WHERE {OWNER_SQL} IN (SELECT value FROM _owners) ORDER BY created_at, id"
            ).fetchall()
        for key, memory_id, content in rows:
            found[key].append((memory_id, content))
        self._vectors.prefetch([content for rows in found.values() for _, content in rows])
        for key, rows in found.items():  # embedded per owner, as they always were
            texts = [content for _, content in rows]
            self._fact_sets[key] = FactSet([i for i, _ in rows], texts, self.embed(texts))

    # ----------------------------------------------------------------- writes

    def add(
        self, memory: NewMemory, *, meta: dict[str, Any] | None = None, memory_id: str | None = None
    ) -> str:
        """Insert a memory (history ADD, change `created`); facts also get links and edges."""
        self._require_transaction()
        memory_id = memory_id or new_memory_id(memory.kind)
        self._insert(memory_id, memory)
        self.history(
            memory_id, "ADD", new_ref=memory_id, meta={"text": memory.content, **(meta or {})}
        )
        self.log_change(memory.conversation_id, memory_id, "created", meta)
        self._count(f"{memory.kind}_added")
        self._after_insert(memory_id, memory)
        return memory_id

    def replace(
        self,
        old_id: str,
        memory: NewMemory,
        *,
        meta: dict[str, Any] | None = None,
        memory_id: str | None = None,
    ) -> str:
        """UPDATE: soft-delete `old_id` (replaced_by = new id) and insert the new version
        (supersedes = old id), with one history row and one `updated` change."""
        self._require_transaction()
        old = self.active(old_id)
        memory_id = memory_id or new_memory_id(memory.kind)
        changes = {"valid_until": self.now(), "state": "soft_deleted", "replaced_by": memory_id}
        if not self._change_buffered(old_id, changes):
            self.con.execute(
                "UPDATE memories SET valid_until = ?, state = 'soft_deleted', replaced_by = ? "
                "WHERE id = ?",
                [changes["valid_until"], memory_id, old_id],
            )
        self._forget_fact(old)
        self._insert(memory_id, memory, supersedes=old_id)
        details = {"old_text": old["content"], "new_text": memory.content, **(meta or {})}
        self.history(old_id, "UPDATE", old_ref=old_id, new_ref=memory_id, meta=details)
        self.log_change(
            memory.conversation_id, memory_id, "updated", {"replaces": old_id, **(meta or {})}
        )
        self._count(f"{memory.kind}_updated")
        self._after_insert(memory_id, memory)
        return memory_id

    def soft_delete(
        self,
        memory_id: str,
        *,
        event: str = "DELETE",
        change: str = "deleted",
        new_ref: str | None = None,
        purge_after_days: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Mark a memory inactive (never removes the row); `new_ref` names what superseded it."""
        self._require_transaction()
        old = self.active(memory_id)
        now = self.now()
        purge_at = now + timedelta(days=purge_after_days) if purge_after_days else None
        changes = {"valid_until": now, "state": "soft_deleted", "purge_at": purge_at}
        if not self._change_buffered(memory_id, changes):
            self.con.execute(
                "UPDATE memories SET valid_until = ?, state = 'soft_deleted', purge_at = ? "
                "WHERE id = ?",
                [now, purge_at, memory_id],
            )
        self._forget_fact(old)
        details = {"text": old["content"], **(meta or {})}
        self.history(memory_id, event, old_ref=memory_id, new_ref=new_ref, meta=details)
        self.log_change(old["conversation_id"], memory_id, change, meta)
        self._count(f"{old['kind']}_{change}")

    def restore(self, memory_id: str, *, meta: dict[str, Any] | None = None) -> None:
        """Make a soft-deleted memory active again (RESTORE, change `restored`)."""
        self._require_transaction()
        row = self.get(memory_id)
        if row is None:
            raise MemoryOpError(f"no memory {memory_id}")
        if row["valid_until"] is None and row["state"] == "active":
            raise MemoryOpError(f"memory {memory_id} is active: nothing to restore")
        if row["replaced_by"]:
            replacement = self.get(row["replaced_by"])
            if replacement is not None and replacement["state"] == "active":
                raise MemoryOpError(
                    f"memory {memory_id} was replaced by {row['replaced_by']}, which is active: "
                    "forget the replacement first"
                )
        # A restore is a deliberate use: it counts as an access and resets the decayed
        # confidence, so the next night's decay or TTL does not take the memory away again.
        self.con.execute(
            "UPDATE memories SET valid_until = NULL, state = 'active', purge_at = NULL, "
            "last_accessed = ?, access_count = access_count + 1, "
            "confidence = greatest(confidence, 1.0) WHERE id = ?",
            [self.now(), memory_id],
        )
        self.link_entities([(memory_id, row["content"])])  # decay removed its links
        if row["kind"] == "fact":
            key = owner_key(row["user_id"], row["conversation_id"])
            if key in self._fact_sets:
                vector = self.embed([row["content"]])[0]
                self._fact_sets[key].add(memory_id, row["content"], vector)
        self.history(
            memory_id, "RESTORE", new_ref=memory_id, meta={"text": row["content"], **(meta or {})}
        )
        self.log_change(row["conversation_id"], memory_id, "restored", meta)
        self._count(f"{row['kind']}_restored")

    def confirm(self, memory_id: str, *, meta: dict[str, Any] | None = None) -> None:
        """Protect a memory from decay: decay_rate 0, confidence 1 (seed 004 `confirm_fact`)."""
        self._require_transaction()
        row = self.active(memory_id)
        self.con.execute(
            "UPDATE memories SET decay_rate = 0.0, confidence = 1.0 WHERE id = ?", [memory_id]
        )
        details = {
            "text": row["content"],
            "old_decay_rate": row["decay_rate"],
            "old_confidence": row["confidence"],
            **(meta or {}),
        }
        self.history(memory_id, "CONFIRM", new_ref=memory_id, meta=details)
        self.log_change(row["conversation_id"], memory_id, "confirmed", meta)
        self._count(f"{row['kind']}_confirmed")

    def record_event(
        self,
        node: str,
        op: str,
        status: str,
        *,
        conversation_id: str | None = None,
        memory_id: str | None = None,
        detail: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """An operational event (seed 003 §14): LLM failures, consolidations, reopenings.

        Inside a transaction it is written at commit, with the transaction's other rows."""
        self._events.append(
            {
                "id": random_id("evt_"),
                "conversation_id": conversation_id,
                "node": node,
                "op": op,
                "status": status,
                "memory_id": memory_id,
                "detail": detail,
                "meta": to_json(meta or {}),
                "ts": self.now(),
            }
        )
        if not self._in_transaction:
            self._flush_events()
        if status == "error":
            self._count("llm_failures" if op in ("extract", "reconcile") else "errors")

    def link_entities(self, items: Sequence[tuple[str, str]]) -> None:
        """Queue entity extraction and linking for (memory id, text) pairs (written at commit)."""
        self._entities.queue(items)

    # ----------------------------------------------------------------- internals

    def _insert(self, memory_id: str, memory: NewMemory, supersedes: str | None = None) -> None:
        check_category(memory.category, self.categories)
        self._new_memories[memory_id] = {
            "id": memory_id,
            "kind": memory.kind,
            "content": memory.content,
            "conversation_id": memory.conversation_id,
            "session_id": memory.session_id,
            "user_id": memory.user_id,
            "agent_id": memory.agent_id,
            "source_role": memory.source_role,
            "speaker": memory.speaker,
            "event_time": memory.event_time,
            "created_at": self.now(),
            "confidence": memory.confidence,
            "importance": memory.importance,
            "category": memory.category,
            "decay_rate": memory.decay_rate,
            "source_ids": list(memory.source_ids),
            "tags": list(memory.tags),
            "attributes": to_json(memory.attributes) if memory.attributes else None,
            "supersedes": supersedes,
            "valid_until": None,
            "state": "active",
            "replaced_by": None,
            "purge_at": None,
        }

    def _change_buffered(self, memory_id: str, changes: dict[str, Any]) -> bool:
        """Apply `changes` to a memory written in this transaction but not flushed yet, in the
        buffer (instead of an UPDATE, which would flush it first); False when it is not there."""
        row = self._new_memories.get(memory_id)
        if row is not None:
            row.update(changes)
        return row is not None

    def _flush_memories(self) -> None:
        if self._new_memories:
            rows = pa.Table.from_pylist(list(self._new_memories.values()), schema=_MEMORY_SCHEMA)
            self._new_memories = {}
            insert_arrow(self._con, "memories", rows)

    def _flush_events(self) -> None:
        if self._events:
            rows = pa.Table.from_pylist(self._events, schema=_EVENT_SCHEMA)
            self._events = []
            insert_arrow(self._con, "events", rows)

    def _after_insert(self, memory_id: str, memory: NewMemory) -> None:
        self.link_entities([(memory_id, memory.content)])
        if memory.kind == "fact" and memory.speaker:
            self._entities.note_speaker(memory_id, memory.speaker)
        if memory.kind != "fact":
            return
        started = time.perf_counter()
        vector = self.embed([memory.content])[0]
        facts = self.facts(owner_key(memory.user_id, memory.conversation_id))
        self._pending_edges += related_edges(
            memory_id, vector, facts, self.link_top_k, self.link_min
        )
        facts.add(memory_id, memory.content, vector)
        self.relation_seconds += time.perf_counter() - started

    def _forget_fact(self, row: dict[str, Any]) -> None:
        if row["kind"] == "fact":
            key = owner_key(row["user_id"], row["conversation_id"])
            if key in self._fact_sets:
                self._fact_sets[key].remove(row["id"])

    def _flush(self) -> None:
        self._flush_memories()  # first: entity links mark the new memories
        self._flush_events()
        self._vectors.flush()
        self._log.flush()
        if self._pending_edges:
            started = time.perf_counter()
            self._count("relations", write_edges(self._con, self._pending_edges))
            self._pending_edges = []
            self.relation_seconds += time.perf_counter() - started
        self._entities.flush()
