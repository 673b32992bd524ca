"""Every write to the memory store goes through `MemoryWriter`; the agent's operations too.

One writer, so the write path, the agent's commands and the maintenance jobs all leave the same
trail. Inside `with writer.transaction():` each write:

* changes `memories` (an insert, or a soft delete: `valid_until`, `state = 'soft_deleted'`;
  rows are never removed here);
* records a `history` row (event, `old_ref`/`new_ref`, actor, meta);
* appends a `change_log` row under the conversation's next revision (`conversation_revisions`,
  bumped in the same transaction), which the delta header of seed 003 §1 reads;
* for a new fact: caches its embedding under the search key (provider, model, sha256(content)),
  so the embed stage does not redo it, queues its entity links, and queues `related_to` edges to
  its most similar active facts of the same conversation (seed 003 §2).

History, change-log, embedding, entity-link and edge rows (and the revision counters) are
buffered and written in bulk when the transaction commits: a DuckDB statement costs
milliseconds, so one per row would dominate a consolidation run.

Decisions:

* Entity links and relation edges get no `history` row: they are derived, re-computable data and
  their own tables carry `created_at` (a LINK row per episode would swamp the history).
* Entities resolve by canonical name + type, then by alias (seed 004); a new spelling becomes an
  alias. An entity first seen as a bare capitalised name (type `other`) takes the type of a later
  confident mention (`TYPE_UPGRADE_CONFIDENCE`): "Anne called" then "my wife is Anne" -> person.
  A fact is also linked to its speaker (a person) when it names them: the extractor's heuristics
  miss a bare sentence-initial name ("Sam now hates pizza.").
* Relations stay inside one conversation (facts of another conversation are about other people).
  An edge points from the new fact to an older one, so `related_to` never appears twice for a
  pair (UNIQUE (from_id, to_id, relation_type) guards it too).
* `LINK_MIN = 0.70` for the default WordLlama model. Its cosines run high between any two facts
  about the same person (the shared name): on LoCoMo rule facts the median pair is 0.37 and the
  90th percentile 0.52-0.75 depending on the conversation, so 0.6 would link almost every fact
  of a talkative speaker; at 0.70 a fact gets 0.4-2.8 edges on average, mostly same-topic pairs
  ("went to an LGBTQ+ counseling workshop" / "joined a new LGBTQ activist group").
* `forget` sets `purge_at` 30 days ahead (seed 003 §7), so a later purge job really removes what
  a user asked to forget; reconciliation deletes and replacements keep no purge date.
* `restore` refuses a memory that was replaced by a correction or an update while the replacement
  is active: two versions of one fact would both be served. Forget the replacement first.
* After a write, the agent's operations run the embed and index stages before returning, so the
  next search sees the change (republishing the index takes about a second on LoCoMo-sized
  stores; there is no cheaper incremental path yet).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from memory_dag import pipeline
from memory_dag.config import Settings
from memory_dag.embeddings import EmbeddingProvider, get_provider
from memory_dag.entities import (
    NAME_TYPES,
    EntityMention,
    KnownEntity,
    canonical_name,
    deduplicate_overlaps,
    extract_entities,
    resolve,
)
from memory_dag.facts import classify_fact, validate_fact
from memory_dag.ids import text_hash
from memory_dag.reconcile import is_near_duplicate, normalise_text
from memory_dag.store import fetch_dicts, open_store, to_json

#: Seed 003 §2: edges per new fact, and the least cosine for an edge (see module docstring).
LINK_TOP_K = 5
LINK_MIN = 0.70
RELATED_TO = "related_to"
_EDGES_PER_STATEMENT = 200
#: An entity of type `other` takes a specific type from a mention at least this confident:
#: "my wife Anne" (0.9) makes "Anne" a person; "working on Jon's business" (0.8) must not make
#: "Jon" a project.
TYPE_UPGRADE_CONFIDENCE = 0.85
#: Confidence of "the speaker of a fact is a person named in it" (above every extractor cue).
SPEAKER_CONFIDENCE = 0.95
#: Seed 003 §7: a forgotten memory is purged this many days later (unless restored).
FORGET_PURGE_DAYS = 30
#: Seed 003 §1: the delta header shows at most this many bullets.
MAX_DELTA_BULLETS = 3
#: Facts decay by default (seed 004); `confirm` sets the rate to 0.
FACT_DECAY_RATE = 0.1

_ID_PREFIX = {"fact": "fact_", "summary": "sum_", "reflection": "ref_", "insight": "ins_"}
_CHANGE_SYMBOL = {
    "created": "+",
    "updated": "↑",
    "merged": "↔",
    "deleted": "×",
    "soft_deleted": "−",
    "restored": "↺",
    "confirmed": "✓",
}
_TS = pa.timestamp("us", tz="UTC")


class MemoryOpError(ValueError):
    """An operation that cannot be done as asked (unknown id, invalid text, wrong state)."""


def new_memory_id(kind: str) -> str:
    return _ID_PREFIX.get(kind, kind[:4] + "_") + uuid.uuid4().hex[:20]


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:20]


def _now() -> datetime:
    return datetime.now(UTC)


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


class FactSet:
    """The active facts of one conversation with their vectors: neighbours for reconciliation
    and relations, kept in step with the writes of this writer."""

    def __init__(self, ids: list[str], texts: list[str], vectors: np.ndarray) -> None:
        self.ids = list(ids)
        self.texts = list(texts)
        self.vectors = np.asarray(vectors, dtype=np.float32)  # (n, dims)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, memory_id: str, text: str, vector: np.ndarray) -> None:
        row = np.asarray(vector, dtype=np.float32).reshape(1, -1)
        self.vectors = row if not self.ids else np.vstack([self.vectors, row])
        self.ids.append(memory_id)
        self.texts.append(text)

    def remove(self, memory_id: str) -> None:
        if memory_id in self.ids:
            position = self.ids.index(memory_id)
            del self.ids[position]
            del self.texts[position]
            self.vectors = np.delete(self.vectors, position, axis=0)

    def vector(self, memory_id: str) -> np.ndarray | None:
        return self.vectors[self.ids.index(memory_id)] if memory_id in self.ids else None

    def similar(self, vector: np.ndarray, k: int, minimum: float = -1.0) -> list[tuple[int, float]]:
        """(position, cosine) of the k most similar facts with cosine >= minimum, best first."""
        if not self.ids or k <= 0:
            return []
        scores = self.vectors @ np.asarray(vector, dtype=np.float32)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(i), float(scores[i])) for i in top if scores[i] >= minimum]


@dataclass
class _Entity:
    id: str
    canonical_name: str
    type: str
    aliases: list[str]
    new: bool = False
    added: int = 0  # links added in this flush
    dirty: bool = False  # aliases or type changed


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
    ) -> None:
        self.con = con
        self.provider = provider
        self.actor = actor
        self.link_top_k = link_top_k
        self.link_min = link_min
        self.counts: dict[str, int] = {}
        self.relation_seconds = 0.0
        self._in_transaction = False
        self._fact_sets: dict[str, FactSet] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._entities: dict[str, _Entity] | None = None
        self._entity_names: dict[str, set[str]] = {}
        self._revisions: dict[str, int] = {}
        self._pending_entities: list[tuple[str, str]] = []
        self._speakers: dict[str, str] = {}  # fact id -> the person it is about
        self._pending_edges: list[dict[str, Any]] = []
        self._pending_history: list[dict[str, Any]] = []
        self._pending_changes: list[dict[str, Any]] = []
        self._pending_embeddings: dict[str, np.ndarray] = {}

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
            self._vectors.clear()
            self._revisions.clear()
            self._entities = None
            for pending in (
                self._pending_entities,
                self._speakers,
                self._pending_edges,
                self._pending_history,
                self._pending_changes,
                self._pending_embeddings,
            ):
                pending.clear()
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

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of `texts`, from the embedding cache when present; new ones are cached."""
        keys = [text_hash(text) for text in texts]
        missing = sorted({key for key in keys if key not in self._vectors})
        if missing:
            cached = self.con.execute(
                "SELECT hash, embedding FROM embedding_cache WHERE provider = ? AND model = ? "
                "AND hash IN (SELECT unnest(?::TEXT[]))",
                [self.provider.name, self.provider.model, missing],
            ).fetchall()
            for key, embedding in cached:
                self._vectors[key] = np.asarray(embedding, dtype=np.float32)
            todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._vectors}
            if todo:
                vectors = self.provider.embed(list(todo.values()))
                for key, vector in zip(todo, vectors, strict=True):
                    self._vectors[key] = self._pending_embeddings[key] = vector
                if not self._in_transaction:
                    self._cache_embeddings()
        if not keys:
            return np.zeros((0, self.provider.dims), dtype=np.float32)
        return np.vstack([self._vectors[key] for key in keys])

    def _cache_embeddings(self) -> None:
        keys = list(self._pending_embeddings)
        if not keys:
            return
        vectors = np.ascontiguousarray(
            np.vstack([self._pending_embeddings[key] for key in keys]), dtype=np.float32
        )
        self._pending_embeddings = {}
        offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
        rows = pa.table(
            {
                "provider": [self.provider.name] * len(keys),
                "model": [self.provider.model] * len(keys),
                "hash": keys,
                "dims": pa.array([vectors.shape[1]] * len(keys), type=pa.int32()),
                "embedding": pa.ListArray.from_arrays(
                    pa.array(offsets), pa.array(vectors.reshape(-1))
                ),
                "created_at": pa.array([_now()] * len(keys), type=_TS),
            }
        )
        self.con.register("_new_embeddings", rows)
        try:
            self.con.execute(
                "INSERT OR IGNORE INTO embedding_cache "
                "SELECT provider, model, hash, dims, embedding, created_at FROM _new_embeddings"
            )
        finally:
            self.con.unregister("_new_embeddings")

    def facts(self, conversation_id: str | None) -> FactSet:
        """The active facts of a conversation (None and '' are the same: no conversation)."""
        key = conversation_id or ""
        if key not in self._fact_sets:
            rows = self.con.execute(
                "SELECT id, content FROM facts WHERE coalesce(conversation_id, '') = ? "
                "ORDER BY created_at, id",
                [key],
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
            [_now(), memory_id, old_id],
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
        now = _now()
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
            "last_accessed = now(), access_count = access_count + 1, "
            "confidence = greatest(confidence, 1.0) WHERE id = ?",
            [memory_id],
        )
        self.link_entities([(memory_id, row["content"])])  # decay removed its links
        if row["kind"] == "fact":
            key = row["conversation_id"] or ""
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

    def history(
        self,
        memory_id: str | None,
        event: str,
        *,
        old_ref: str | None = None,
        new_ref: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """One audit row (seed 003 §8); also used alone for decisions that change nothing."""
        self._require_transaction()
        self._pending_history.append(
            {
                "id": _new_id("hist_"),
                "memory_id": memory_id,
                "event": event,
                "old_ref": old_ref,
                "new_ref": new_ref,
                "actor": self.actor,
                "meta": to_json(meta or {}),
                "ts": _now(),
            }
        )

    def log_change(
        self,
        conversation_id: str | None,
        memory_id: str | None,
        event: str,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """A change-log row under the conversation's next revision; returns that revision.

        The counter is read once per transaction and written back with the rows at commit: the
        write lock makes this connection the only writer, so the bump is atomic with the change.
        """
        self._require_transaction()
        conversation = conversation_id or ""
        if conversation not in self._revisions:
            row = self.con.execute(
                "SELECT rev FROM conversation_revisions WHERE conversation_id = ?", [conversation]
            ).fetchone()
            self._revisions[conversation] = int(row[0]) if row else 0
        self._revisions[conversation] += 1
        rev = self._revisions[conversation]
        self._pending_changes.append(
            {
                "id": _new_id("chg_"),
                "conversation_id": conversation,
                "rev": rev,
                "memory_id": memory_id,
                "event": event,
                "meta": to_json(meta or {}),
                "ts": _now(),
            }
        )
        return rev

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
                _new_id("evt_"),
                conversation_id,
                node,
                op,
                status,
                memory_id,
                detail,
                to_json(meta or {}),
                _now(),
            ],
        )
        if status == "error":
            self._count("llm_failures" if op in ("extract", "reconcile") else "errors")

    def link_entities(self, items: Sequence[tuple[str, str]]) -> None:
        """Queue entity extraction and linking for (memory id, text) pairs (written at commit)."""
        self._pending_entities.extend(items)

    # ----------------------------------------------------------------- internals

    def active(self, memory_id: str) -> dict[str, Any]:
        row = self.get(memory_id)
        if row is None:
            raise MemoryOpError(f"no memory {memory_id}")
        if row["valid_until"] is not None or row["state"] != "active":
            raise MemoryOpError(f"memory {memory_id} is not active (state {row['state']})")
        return row

    def _insert(self, memory_id: str, memory: NewMemory, supersedes: str | None = None) -> None:
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
                _now(),
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
            self._speakers[memory_id] = memory.speaker
        if memory.kind != "fact":
            return
        started = time.perf_counter()
        vector = self.embed([memory.content])[0]
        facts = self.facts(memory.conversation_id)
        now = _now()
        for position, score in facts.similar(vector, self.link_top_k, self.link_min):
            self._pending_edges.append(
                {
                    "id": _new_id("rel_"),
                    "from_id": memory_id,
                    "to_id": facts.ids[position],
                    "relation_type": RELATED_TO,
                    "strength": round(score, 4),
                    "created_at": now,
                }
            )
        facts.add(memory_id, memory.content, vector)
        self.relation_seconds += time.perf_counter() - started

    def _forget_fact(self, row: dict[str, Any]) -> None:
        if row["kind"] == "fact":
            key = row["conversation_id"] or ""
            if key in self._fact_sets:
                self._fact_sets[key].remove(row["id"])

    def _flush(self) -> None:
        self._cache_embeddings()
        if self._pending_history:
            self._insert_rows("history", self._pending_history, _HISTORY_SCHEMA)
            self._pending_history = []
        if self._pending_changes:
            self._insert_rows("change_log", self._pending_changes, _CHANGE_LOG_SCHEMA)
            self._pending_changes = []
            revisions = sorted(self._revisions.items())
            self.con.execute(
                "INSERT INTO conversation_revisions (conversation_id, rev) "
                "SELECT unnest(?::TEXT[]), unnest(?::BIGINT[]) "
                "ON CONFLICT (conversation_id) DO UPDATE SET rev = excluded.rev",
                [[c for c, _ in revisions], [r for _, r in revisions]],
            )
        self._revisions = {}
        if self._pending_edges:
            started = time.perf_counter()
            self._count("relations", self._write_edges(self._pending_edges))
            self._pending_edges = []
            self.relation_seconds += time.perf_counter() - started
        if self._pending_entities:
            self._write_entity_links(self._pending_entities)
            self._pending_entities = []
            self._speakers = {}

    def _write_edges(self, edges: list[dict[str, Any]]) -> int:
        """Insert edges with plain VALUES statements: for the few edges of one write this is
        several times cheaper than registering an Arrow table (seed 003 §2: <= 2 ms/edge).

        Edges always point from a memory written in this transaction to an older one, so
        neither a duplicate nor a reverse edge can exist yet; UNIQUE (from_id, to_id,
        relation_type) with ON CONFLICT DO NOTHING guards it all the same.
        """
        inserted = 0
        columns = ("id", "from_id", "to_id", "relation_type", "strength", "created_at")
        for start in range(0, len(edges), _EDGES_PER_STATEMENT):
            chunk = edges[start : start + _EDGES_PER_STATEMENT]
            values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
            row = self.con.execute(
                f"INSERT INTO relations ({', '.join(columns)}) VALUES {values} "
                "ON CONFLICT DO NOTHING",
                [edge[column] for edge in chunk for column in columns],
            ).fetchone()
            inserted += int(row[0]) if row else 0
        return inserted

    # ----------------------------------------------------------------- entities

    def _load_entities(self) -> dict[str, _Entity]:
        if self._entities is None:
            self._entities = {}
            self._entity_names = {}
            rows = self.con.execute(
                "SELECT id, canonical_name, type, aliases FROM entities"
            ).fetchall()
            for entity_id, name, kind, aliases in rows:
                self._index_entity(_Entity(entity_id, name, kind, list(aliases or [])))
        return self._entities

    def _index_entity(self, entity: _Entity) -> None:
        assert self._entities is not None
        self._entities[entity.id] = entity
        for name in [entity.canonical_name, *entity.aliases]:
            self._entity_names.setdefault(name.strip().casefold(), set()).add(entity.id)

    def _resolve_entity(self, mention: Any) -> _Entity:
        """Seed 004 `create_or_get_entity`: canonical name + type, then alias; else a new one."""
        entities = self._load_entities()
        keys = {mention.canonical.casefold(), mention.text.strip().casefold()}
        candidate_ids = set().union(*(self._entity_names.get(key, set()) for key in keys))
        candidates = [
            KnownEntity(e.id, e.canonical_name, e.type, tuple(e.aliases))
            for e in (entities[i] for i in sorted(candidate_ids))
        ]
        known = resolve(mention, candidates)
        if known is None:
            entity = _Entity(_new_id("ent_"), mention.canonical, mention.type, [], new=True)
            self._index_entity(entity)
            self._count("entities_created")
        else:
            entity = entities[known.id]
            if (
                entity.type == "other"
                and mention.type in NAME_TYPES - {"other"}
                and mention.confidence >= TYPE_UPGRADE_CONFIDENCE
                and not any(
                    e.canonical_name == entity.canonical_name and e.type == mention.type
                    for e in entities.values()
                )
            ):
                entity.type = mention.type  # a strong cue told us what the bare name is
                entity.dirty = True
        alias = " ".join(mention.text.split())
        known_names = {entity.canonical_name.casefold(), *(a.casefold() for a in entity.aliases)}
        if alias and alias.casefold() not in known_names:
            entity.aliases.append(alias)
            entity.dirty = True
            self._entity_names.setdefault(alias.casefold(), set()).add(entity.id)
        return entity

    def _mentions(self, memory_id: str, text: str) -> list[EntityMention]:
        """The fast extractor's entities, plus the speaker of a fact named in it: a fact is
        about the person who said it, whatever the capitalisation heuristics make of the name
        ("Sam now hates pizza." has no cue that "Sam" is a name)."""
        mentions = extract_entities(text)
        speaker = self._speakers.get(memory_id)
        found = re.search(rf"\b{re.escape(speaker)}\b", text) if speaker else None
        if speaker and found:
            # Every use of the speaker's name is the speaker ("Jon is working on Jon's business"
            # must not make a project called Jon).
            name = canonical_name(speaker, "person")
            mentions = [m for m in mentions if m.canonical != name]
            mentions.append(
                EntityMention(
                    text=speaker,
                    canonical=name,
                    type="person",
                    start=found.start(),
                    end=found.end(),
                    confidence=SPEAKER_CONFIDENCE,
                    provider="speaker",
                )
            )
        return deduplicate_overlaps(mentions)

    def _write_entity_links(self, items: list[tuple[str, str]]) -> None:
        memory_ids = list(dict.fromkeys(memory_id for memory_id, _ in items))
        # Memories processed again (a re-ingested episode) lose their old links first.
        self.con.execute(
            "UPDATE entities SET mention_count = entities.mention_count - gone.n "
            "FROM (SELECT entity_id, count(*) AS n FROM memory_entities "
            "      WHERE memory_id IN (SELECT unnest(?::TEXT[])) GROUP BY entity_id) gone "
            "WHERE entities.id = gone.entity_id",
            [memory_ids],
        )
        self.con.execute(
            "DELETE FROM memory_entities WHERE memory_id IN (SELECT unnest(?::TEXT[]))",
            [memory_ids],
        )
        now = _now()
        links: list[dict[str, Any]] = []
        touched: dict[str, _Entity] = {}
        for memory_id, text in dict(items).items():
            linked: set[str] = set()
            for mention in self._mentions(memory_id, text):
                entity = self._resolve_entity(mention)
                touched[entity.id] = entity
                if entity.id in linked:
                    continue
                linked.add(entity.id)
                entity.added += 1
                links.append(
                    {
                        "memory_id": memory_id,
                        "entity_id": entity.id,
                        "mention": mention.text,
                        "provider": mention.provider,
                        "created_at": now,
                    }
                )
        new_rows = [
            {
                "id": e.id,
                "canonical_name": e.canonical_name,
                "type": e.type,
                "aliases": e.aliases,
                "mention_count": e.added,
                "created_at": now,
                "updated_at": now,
            }
            for e in touched.values()
            if e.new
        ]
        changed_rows = [
            {"id": e.id, "type": e.type, "aliases": e.aliases, "added": e.added}
            for e in touched.values()
            if not e.new and (e.added or e.dirty)
        ]
        if new_rows:
            self._insert_rows("entities", new_rows, _ENTITY_SCHEMA)
        if changed_rows:
            self.con.register("_entity_changes", pa.Table.from_pylist(changed_rows, _CHANGE_SCHEMA))
            try:
                self.con.execute(
                    "UPDATE entities SET mention_count = entities.mention_count + c.added, "
                    "type = c.type, aliases = c.aliases, updated_at = ? "
                    "FROM _entity_changes c WHERE entities.id = c.id",
                    [now],
                )
            finally:
                self.con.unregister("_entity_changes")
        if links:
            self._insert_rows("memory_entities", links, _LINK_SCHEMA)
        self.con.execute(
            "UPDATE memories SET attributes = json_merge_patch(coalesce(attributes, '{}'::JSON), "
            "json_object('entities_at', ?::VARCHAR)) WHERE id IN (SELECT unnest(?::TEXT[]))",
            [now.isoformat(), memory_ids],
        )
        for entity in touched.values():
            entity.new = entity.dirty = False
            entity.added = 0
        self._count("entity_links", len(links))
        self._count("memories_linked", len(memory_ids))

    def _insert_rows(self, table: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
        data = pa.Table.from_pylist(rows, schema=schema)
        self.con.register("_rows", data)
        try:
            columns = ", ".join(schema.names)
            self.con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _rows")
        finally:
            self.con.unregister("_rows")


_ENTITY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("canonical_name", pa.string()),
        ("type", pa.string()),
        ("aliases", pa.list_(pa.string())),
        ("mention_count", pa.int64()),
        ("created_at", _TS),
        ("updated_at", _TS),
    ]
)
_HISTORY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("memory_id", pa.string()),
        ("event", pa.string()),
        ("old_ref", pa.string()),
        ("new_ref", pa.string()),
        ("actor", pa.string()),
        ("meta", pa.string()),
        ("ts", _TS),
    ]
)
_CHANGE_LOG_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("conversation_id", pa.string()),
        ("rev", pa.int64()),
        ("memory_id", pa.string()),
        ("event", pa.string()),
        ("meta", pa.string()),
        ("ts", _TS),
    ]
)
_CHANGE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("aliases", pa.list_(pa.string())),
        ("added", pa.int64()),
    ]
)
_LINK_SCHEMA = pa.schema(
    [
        ("memory_id", pa.string()),
        ("entity_id", pa.string()),
        ("mention", pa.string()),
        ("provider", pa.string()),
        ("created_at", _TS),
    ]
)


# =============================================================================================
# The agent-facing operations (seed 004 tools; the CLI commands call these).


@dataclass
class WriteResult:
    """What an operation did: `status` is created | duplicate | updated | confirmed |
    forgotten | restored; `memory_id` is the memory now holding the information."""

    status: str
    memory_id: str
    replaced_id: str | None = None
    revision: int | None = None
    index_rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def _writer(settings: Settings, actor: str) -> Iterator[MemoryWriter]:
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=actor)
        with writer.transaction():
            yield writer


def _revision(settings: Settings, conversation_id: str | None) -> int:
    with open_store(settings.db_path, read_only=True) as con:
        row = con.execute(
            "SELECT rev FROM conversation_revisions WHERE conversation_id = ?",
            [conversation_id or ""],
        ).fetchone()
    return int(row[0]) if row else 0


def refresh_index(settings: Settings) -> int:
    """Embed what is missing and publish the search index: a write is searchable on return."""
    return int(pipeline.refresh_search_index(settings)[-1].counts.get("rows", 0))


def _finish(
    settings: Settings, result: WriteResult, conversation_id: str | None, refresh: bool
) -> WriteResult:
    result.revision = _revision(settings, conversation_id)
    if refresh:
        result.index_rows = refresh_index(settings)
    return result


def _fact_text(text: str) -> str:
    cleaned = validate_fact(text)
    if cleaned is None:
        raise MemoryOpError(
            "a memory is 1-2 sentences of at most 280 characters, and not empty (seed 003 §9)"
        )
    return cleaned


def remember(
    settings: Settings,
    text: str,
    *,
    conversation_id: str | None = None,
    session_id: str | None = None,
    speaker: str | None = None,
    category: str | None = None,
    importance: int | None = None,
    user_id: str | None = None,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    actor: str = "agent",
    refresh: bool = True,
) -> WriteResult:
    """Save an explicit fact (seed 004 `remember_fact`).

    The text is stored as given (after the seed 003 §9 checks); a near-duplicate of an active
    fact of the conversation (same words, or word Jaccard >= 0.75) is not stored again and its
    id is returned with status `duplicate`. Use `correct` to replace a fact.
    """
    content = _fact_text(text)
    guessed_category, guessed_importance = classify_fact(content)
    with _writer(settings, actor) as writer:
        facts = writer.facts(conversation_id)
        key = normalise_text(content)
        for memory_id, existing in zip(facts.ids, facts.texts, strict=True):
            if normalise_text(existing) == key or is_near_duplicate(content, [existing]):
                return WriteResult("duplicate", memory_id)
        memory = NewMemory(
            content=content,
            conversation_id=conversation_id,
            session_id=session_id,
            speaker=speaker,
            source_role="agent",
            category=category or guessed_category,
            importance=importance if importance is not None else guessed_importance,
            event_time=_now(),
            user_id=user_id,
            agent_id=agent_id,
            tags=list(tags),
        )
        memory_id = writer.add(memory, meta={"op": "remember"})
    return _finish(settings, WriteResult("created", memory_id), conversation_id, refresh)


def correct(
    settings: Settings, memory_id: str, text: str, *, actor: str = "agent", refresh: bool = True
) -> WriteResult:
    """Replace a memory with a corrected text (seed 004 `correct_fact`): the old one is
    soft-deleted with `replaced_by`, the new one `supersedes` it and keeps its scope and sources."""
    content = _fact_text(text)
    with _writer(settings, actor) as writer:
        old = writer.active(memory_id)
        if old["kind"] == "episode":
            raise MemoryOpError("episodes mirror transcript files: edit the transcript instead")
        if normalise_text(old["content"]) == normalise_text(content):
            raise MemoryOpError(f"memory {memory_id} already says that")
        category, importance = classify_fact(content)
        memory = NewMemory(
            content=content,
            kind=old["kind"],
            conversation_id=old["conversation_id"],
            session_id=old["session_id"],
            speaker=old["speaker"],
            source_role=actor,
            category=old["category"] or category,
            importance=old["importance"] if old["importance"] is not None else importance,
            event_time=old["event_time"],
            source_ids=list(old["source_ids"] or []),
            user_id=old["user_id"],
            agent_id=old["agent_id"],
            tags=list(old["tags"] or []),
            decay_rate=old["decay_rate"],
        )
        new_id = writer.replace(memory_id, memory, meta={"op": "correct"})
    result = WriteResult("updated", new_id, replaced_id=memory_id)
    return _finish(settings, result, old["conversation_id"], refresh)


def confirm(settings: Settings, memory_id: str, *, actor: str = "agent") -> WriteResult:
    """Protect a memory: it no longer decays (decay_rate 0) and is fully trusted (confidence 1)."""
    with _writer(settings, actor) as writer:
        writer.confirm(memory_id, meta={"op": "confirm"})
        conversation = writer.get(memory_id)["conversation_id"]
    # Decay and confidence are not part of the search index: nothing to republish.
    return _finish(settings, WriteResult("confirmed", memory_id), conversation, refresh=False)


def forget(
    settings: Settings, memory_id: str, *, actor: str = "agent", refresh: bool = True
) -> WriteResult:
    """Soft-delete a memory; it is purged `FORGET_PURGE_DAYS` later unless restored."""
    with _writer(settings, actor) as writer:
        row = writer.active(memory_id)
        if row["kind"] == "episode":
            raise MemoryOpError("episodes mirror transcript files: edit the transcript instead")
        writer.soft_delete(
            memory_id,
            change="soft_deleted",
            purge_after_days=FORGET_PURGE_DAYS,
            meta={"op": "forget"},
        )
    return _finish(settings, WriteResult("forgotten", memory_id), row["conversation_id"], refresh)


def restore(
    settings: Settings, memory_id: str, *, actor: str = "agent", refresh: bool = True
) -> WriteResult:
    """Bring back a soft-deleted memory (forgotten, contradicted or expired)."""
    with _writer(settings, actor) as writer:
        writer.restore(memory_id, meta={"op": "restore"})
        conversation = writer.get(memory_id)["conversation_id"]
    return _finish(settings, WriteResult("restored", memory_id), conversation, refresh)


# --------------------------------------------------------------------------- reading


def stats(settings: Settings) -> dict[str, Any]:
    """Counts by kind (active, soft-deleted), the latest record, entities, relations, sessions."""
    with open_store(settings.db_path, read_only=True) as con:
        kinds = fetch_dicts(
            con,
            "SELECT kind, count(*) FILTER (WHERE valid_until IS NULL AND state = 'active') "
            "AS active, count(*) FILTER (WHERE valid_until IS NOT NULL OR state <> 'active') "
            "AS soft_deleted, max(created_at) AS latest_at FROM memories GROUP BY kind "
            "ORDER BY kind",
        )
        latest = fetch_dicts(
            con,
            "SELECT id, kind, conversation_id, created_at, content FROM memories "
            "ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        counts = con.execute(
            "SELECT (SELECT count(*) FROM entities), (SELECT count(*) FROM memory_entities), "
            "(SELECT count(*) FROM relations), "
            "(SELECT count(*) FROM sessions_consolidations WHERE consolidated_at IS NULL), "
            "(SELECT count(*) FROM sessions_consolidations WHERE consolidated_at IS NOT NULL)"
        ).fetchone()
    return {
        "kinds": {row.pop("kind"): row for row in kinds},
        "latest": latest[0] if latest else None,
        "entities": int(counts[0]),
        "entity_links": int(counts[1]),
        "relations": int(counts[2]),
        "sessions": {"pending": int(counts[3]), "consolidated": int(counts[4])},
    }


def entity_profile(settings: Settings, name: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """Entities called `name` (canonical name or alias, any case) with their active memories,
    facts first, newest first (seed 004 `get_entity_info`)."""
    with open_store(settings.db_path, read_only=True) as con:
        entities = fetch_dicts(
            con,
            "SELECT id, canonical_name, type, aliases, mention_count, summary, created_at, "
            "updated_at FROM entities WHERE lower(canonical_name) = lower(?) "
            "OR list_contains(list_transform(aliases, lambda a: lower(a)), lower(?)) "
            "ORDER BY mention_count DESC, canonical_name",
            [name.strip(), name.strip()],
        )
        for entity in entities:
            entity["memories"] = fetch_dicts(
                con,
                "SELECT m.id, m.kind, m.category, m.conversation_id, m.speaker, m.event_time, "
                "m.content, l.mention FROM memory_entities l JOIN memories m ON m.id = l.memory_id "
                "WHERE l.entity_id = ? AND m.valid_until IS NULL AND m.state = 'active' "
                "ORDER BY m.kind <> 'fact', coalesce(m.event_time, m.created_at) DESC, m.id "
                "LIMIT ?",
                [entity["id"], limit],
            )
            entity["memory_counts"] = dict(
                con.execute(
                    "SELECT m.kind, count(*) FROM memory_entities l JOIN memories m "
                    "ON m.id = l.memory_id WHERE l.entity_id = ? AND m.valid_until IS NULL "
                    "AND m.state = 'active' GROUP BY m.kind ORDER BY m.kind",
                    [entity["id"]],
                ).fetchall()
            )
    return entities


def memory_history(settings: Settings, memory_id: str) -> dict[str, Any]:
    """The memory and every history row that names it (as the subject, old or new reference)."""
    with open_store(settings.db_path, read_only=True) as con:
        rows = fetch_dicts(
            con,
            "SELECT id, kind, state, content, category, importance, conversation_id, session_id, "
            "speaker, event_time, created_at, valid_until, purge_at, confidence, decay_rate, "
            "source_ids, replaced_by, supersedes FROM memories WHERE id = ?",
            [memory_id],
        )
        if not rows:
            raise MemoryOpError(f"no memory {memory_id}")
        events = fetch_dicts(
            con,
            "SELECT ts, event, memory_id, old_ref, new_ref, actor, meta FROM history "
            "WHERE ? IN (memory_id, old_ref, new_ref) ORDER BY ts, id",
            [memory_id],
        )
    for event in events:
        event["meta"] = json.loads(event["meta"]) if event["meta"] else {}
    return {"memory": rows[0], "history": events}


@dataclass
class Delta:
    """Changes after revision `since` (seed 003 §1) and the header an agent is shown."""

    since: int
    revisions: dict[str, int]
    changes: list[dict[str, Any]]
    header: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def changes(settings: Settings, since: int, conversation_id: str | None = None) -> Delta:
    """What changed after revision `since`, oldest first, with the delta header.

    Revisions count per conversation. With `conversation_id` None every conversation is read,
    each against its own revision. The header holds at most 3 bullets: the latest change of
    each memory, newest first; it is empty when nothing changed.
    """
    where = "c.rev > ?"
    params: list[Any] = [since]
    if conversation_id is not None:
        where += " AND c.conversation_id = ?"
        params.append(conversation_id)
    with open_store(settings.db_path, read_only=True) as con:
        rows = fetch_dicts(
            con,
            "SELECT c.conversation_id, c.rev, c.event, c.memory_id, c.ts, c.meta, m.kind, "
            "m.category, m.importance, m.content FROM change_log c "
            f"LEFT JOIN memories m ON m.id = c.memory_id WHERE {where} "
            "ORDER BY c.conversation_id, c.rev",
            params,
        )
        revision_rows = con.execute(
            "SELECT conversation_id, rev FROM conversation_revisions"
            + (" WHERE conversation_id = ?" if conversation_id is not None else ""),
            [conversation_id] if conversation_id is not None else [],
        ).fetchall()
    for row in rows:
        row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
    revisions = {conversation: int(rev) for conversation, rev in revision_rows}
    if conversation_id is not None:
        revisions.setdefault(conversation_id, 0)
    return Delta(since, revisions, rows, delta_header(since, rows))


def delta_header(since: int, rows: list[dict[str, Any]]) -> str:
    """The delta header: "Memory updates since rev X:" and up to 3 bullets such as
    "- +created: [preferences] Sam loves pizza (imp=3)"; "" when nothing changed."""
    latest: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["ts"], r["rev"])):
        latest[row["memory_id"] or row["event"]] = row
    newest = sorted(latest.values(), key=lambda r: (r["ts"], r["rev"]), reverse=True)
    bullets = [_bullet(row) for row in newest[:MAX_DELTA_BULLETS]]
    return "\n".join([f"Memory updates since rev {since}:", *bullets]) if bullets else ""


def _bullet(row: dict[str, Any]) -> str:
    event = row["event"]
    text = (row["content"] or row["meta"].get("text") or row["memory_id"] or "").rstrip(". ")
    category = f"[{row['category']}] " if row.get("category") else ""
    importance = f" (imp={row['importance']})" if event == "created" and row["importance"] else ""
    return f"- {_CHANGE_SYMBOL.get(event, '*')}{event}: {category}{text}{importance}"
