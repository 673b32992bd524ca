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

Those rows are buffered and written in bulk when the transaction commits.

* `restore` refuses a memory that was replaced by a correction or an update while the replacement
  is active: two versions of one fact would both be served. Forget the replacement first.
* Facts are grouped by owner (`scope.owner_key`: the user, else the conversation): the
  neighbours a new fact is related to never belong to another user. A memory's category must
  be defined in `categories.yaml` (`scope.check_category`).
* `now` fixes the writer's clock (the maintenance jobs' and the tests' clocks); each stamp is a
  microsecond after the previous one, so rows written in one transaction keep their order.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np

from memory_dag.embed.cache import VectorCache
from memory_dag.embed.providers import EmbeddingProvider
from memory_dag.memories.entity_links import EntityLinker
from memory_dag.memories.history import HistoryLog
from memory_dag.memories.relations import LINK_MIN, LINK_TOP_K, FactSet, related_edges, write_edges
from memory_dag.scope import check_category, owner_key, owner_where
from memory_dag.store.connection import fetch_dicts, to_json

#: Facts decay by default (seed 004); `confirm` sets the rate to 0.
FACT_DECAY_RATE = 0.1

_ID_PREFIX = {"fact": "fact_", "summary": "sum_", "reflection": "ref_", "insight": "ins_"}


class MemoryOpError(ValueError):
    """An operation that cannot be done as asked (unknown id, invalid text, wrong state)."""


def new_memory_id(kind: str) -> str:
    return _ID_PREFIX.get(kind, kind[:4] + "_") + uuid.uuid4().hex[:20]


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
        self.con = con
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
        self._entities = EntityLinker(con, self._count)
        self._pending_edges: list[dict[str, Any]] = []

    # ----------------------------------------------------------------- transactions

    @contextmanager
    def transaction(self) -> Iterator[MemoryWriter]:
        """All-or-nothing writes. History, change-log, embedding, entity and edge rows are
        buffered and written in bulk before COMMIT (one statement each, not one per write)."""
        if self._in_transaction:
            raise RuntimeError("MemoryWriter transactions do not nest")
        self.con.execute("BEGIN TRANSACTION")
        self._in_transaction = True
        try:
            yield self
            self._flush()
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            # In-memory views may hold rows that were rolled back: load them again when needed.
            self._fact_sets.clear()
            self._vectors.reset()
            self._log.reset()
            self._entities.reset()
            self._pending_edges.clear()
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
        key = owner
        if key not in self._fact_sets:
            where, params = owner_where(owner)
            rows = self.con.execute(
                f"SELECT id, content FROM facts WHERE {where} ORDER BY created_at, id", params
            ).fetchall()
            texts = [row[1] for row in rows]
            self._fact_sets[key] = FactSet([row[0] for row in rows], texts, self.embed(texts))
        return self._fact_sets[key]

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
        self.con.execute(
            "UPDATE memories SET valid_until = ?, state = 'soft_deleted', replaced_by = ? "
            "WHERE id = ?",
            [self.now(), memory_id, old_id],
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
        """An operational event (seed 003 §14): LLM failures, consolidations, reopenings."""
        self.con.execute(
            "INSERT INTO events (id, conversation_id, node, op, status, memory_id, detail, "
            "meta, ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                "evt_" + uuid.uuid4().hex[:20],
                conversation_id,
                node,
                op,
                status,
                memory_id,
                detail,
                to_json(meta or {}),
                self.now(),
            ],
        )
        if status == "error":
            self._count("llm_failures" if op in ("extract", "reconcile") else "errors")

    def link_entities(self, items: Sequence[tuple[str, str]]) -> None:
        """Queue entity extraction and linking for (memory id, text) pairs (written at commit)."""
        self._entities.queue(items)

    # ----------------------------------------------------------------- internals

    def _insert(self, memory_id: str, memory: NewMemory, supersedes: str | None = None) -> None:
        check_category(memory.category)
        self.con.execute(
            """
            INSERT INTO memories (id, kind, content, conversation_id, session_id, user_id,
                agent_id, source_role, speaker, event_time, created_at, confidence, importance,
                category, decay_rate, source_ids, tags, attributes, supersedes)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?::TEXT[], ?::TEXT[], ?, ?)
            """,
            [
                memory_id,
                memory.kind,
                memory.content,
                memory.conversation_id,
                memory.session_id,
                memory.user_id,
                memory.agent_id,
                memory.source_role,
                memory.speaker,
                memory.event_time,
                self.now(),
                memory.confidence,
                memory.importance,
                memory.category,
                memory.decay_rate,
                list(memory.source_ids),
                list(memory.tags),
                to_json(memory.attributes) if memory.attributes else None,
                supersedes,
            ],
        )

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
        self._vectors.flush()
        self._log.flush()
        if self._pending_edges:
            started = time.perf_counter()
            self._count("relations", write_edges(self.con, self._pending_edges))
            self._pending_edges = []
            self.relation_seconds += time.perf_counter() - started
        self._entities.flush()
