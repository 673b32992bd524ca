"""The live writer: `MemoryWriter`'s calls, recorded in the journal instead of run on DuckDB.

The write path (`write_path.write_turns`), the agent operations (`agent_ops`) and the consent
gate take either writer. `MemoryWriter` runs each call on the DuckDB file at once; `LiveWriter`
(used by `Memory`, the service and the CLI) never opens it:

* it reads what it needs from the published index and the delta segment (`index/delta.py`):
  a memory by id from the version's catalog with the delta's newer word on top, an owner's
  active facts with their index vectors (reconciliation and `remember`'s dedup neighbours);
* each call becomes a journal op (`journal.py`) and, when it changes what search returns, a
  delta record with the row embedded now;
* `LiveStore.writer()` holds the journal's lock from the first read to the last write, and
  appends the batch (one fsynced line) and then its delta records before returning: a write is
  durable and searchable from every process when the call returns. A running pipeline never
  blocks it, and it never blocks a pipeline: DuckDB is not touched.

The pipeline folds the journal into DuckDB by replaying the same calls on a `MemoryWriter`
(`fold.py`), with the same memory ids, so nothing is written twice.

(Over 500 lines on purpose: `LiveView`, `LiveWriter` and `LiveStore` mirror `MemoryWriter`
call for call; kept together so the two writers are compared side by side.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.index.delta import append_records, compact, delta_path, last_seq, record
from memory_dag.index.search import Searcher, get_searcher
from memory_dag.memories.consent import ChangeRequest, ConsentGate
from memory_dag.memories.journal import Journal
from memory_dag.memories.relations import FactSet
from memory_dag.memories.writer import Clock, MemoryOpError, NewMemory, new_memory_id
from memory_dag.scope import Scope, check_category, owner_key, owner_of

ACTOR = "live"
#: Kinds the search index holds as memories (the `search_documents` view).
SEARCHED_KINDS = ("fact", "summary", "reflection", "insight", "procedural")
#: A writer compacts the delta segment when the file is larger than this.
COMPACT_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LiveTurn:
    """A transcript line written live: its episode and its search row's text."""

    episode_id: str
    turn_id: str
    path: str
    line: int
    role: str
    speaker: str | None
    content: str
    text: str
    search_text: str
    conversation_id: str | None
    session_id: str
    user_id: str | None
    event_time: datetime


def memory_row(memory_id: str, memory: NewMemory, created_at: datetime) -> dict[str, Any]:
    """A new memory as a `memories` row (the catalog's columns)."""
    return {
        "id": memory_id,
        "kind": memory.kind,
        "content": memory.content,
        "state": "active",
        "conversation_id": memory.conversation_id,
        "session_id": memory.session_id,
        "user_id": memory.user_id,
        "agent_id": memory.agent_id,
        "source_role": memory.source_role,
        "speaker": memory.speaker,
        "category": memory.category,
        "importance": memory.importance,
        "pinned": False,
        "event_time": memory.event_time,
        "created_at": created_at,
        "valid_until": None,
        "purge_at": None,
        "confidence": memory.confidence,
        "decay_rate": memory.decay_rate,
        "source_ids": list(memory.source_ids),
        "tags": list(memory.tags),
        "attributes": memory.attributes,
        "replaced_by": None,
        "supersedes": None,
    }


def search_row(row: dict[str, Any]) -> dict[str, Any]:
    """A memory's row in the search index, as the `search_documents` view makes it."""
    return {
        "id": row["id"],
        "kind": row["kind"],
        "source": "memories",
        "path": "",
        "start_line": 0,
        "end_line": 0,
        "text": row["content"],
        "search_text": row["content"],
        "speaker": row["speaker"],
        "turn_ids": [],
        "conversation_id": row["conversation_id"],
        "session_id": row["session_id"],
        "event_time": row["event_time"] or row["created_at"],
        "role": row["source_role"],
        "category": row["category"],
        "user_id": row["user_id"],
        "agent_id": row["agent_id"],
        "importance": row["importance"],
        "pinned": bool(row["pinned"]),
        "updated_at": row["created_at"],
    }


def new_memory(data: dict[str, Any]) -> NewMemory:
    """A `NewMemory` from its journal form."""
    fields = {f.name for f in dataclasses.fields(NewMemory)}
    values = {key: value for key, value in data.items() if key in fields}
    if isinstance(values.get("event_time"), str):
        values["event_time"] = datetime.fromisoformat(values["event_time"])
    return NewMemory(**values)


def change_request(data: dict[str, Any]) -> ChangeRequest:
    """A consent `ChangeRequest` from its journal form."""
    return ChangeRequest(**{**data, "memory": new_memory(data["memory"])})


class LiveView:
    """Memories as they stand now without the DuckDB file: the published version's catalog
    and rows with the delta's newer word on top (what `MemoryWriter` reads from the store)."""

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self.index = searcher.index
        self.overlay = searcher.overlay()
        self.provider = searcher.provider or get_provider(searcher.settings)
        self._rows: dict[str, dict[str, Any]] = {}
        self._fact_sets: dict[str, FactSet] = {}
        self._vectors: dict[str, np.ndarray] = {}

    def memories(self) -> list[dict[str, Any]]:
        """Every derived memory (any state), the delta's version of each when it has one."""
        rows = {row["id"]: row for row in self.index.catalog().rows()}
        rows.update(
            (memory_id, row)
            for memory_id, row in self.overlay.memories.items()
            if row.get("kind") in SEARCHED_KINDS
        )
        return list(rows.values())

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """A memory's row as it stands now: this batch's, the delta's, else the catalog's."""
        row = self._rows.get(memory_id) or self.overlay.memories.get(memory_id)
        if row is None:
            row = self.index.catalog().get(memory_id)
        return dict(row) if row is not None else None

    def active(self, memory_id: str) -> dict[str, Any]:
        row = self.get(memory_id)
        if row is None:
            raise MemoryOpError(f"no memory {memory_id}")
        if row["valid_until"] is not None or row["state"] != "active":
            raise MemoryOpError(f"memory {memory_id} is not active (state {row['state']})")
        return row

    def embed(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            for text, vector in zip(missing, self.provider.embed(missing), strict=True):
                self._vectors[text] = np.asarray(vector, dtype=np.float32)
        if not texts:
            return np.zeros((0, self.provider.dims), dtype=np.float32)
        return np.vstack([self._vectors[t] for t in texts])

    def facts(self, owner: str) -> FactSet:
        """The owner's active facts: the published version's not hidden, then the delta's."""
        if owner not in self._fact_sets:
            rows = self._published_facts(owner)
            index, overlay = self.index, self.overlay
            ids = [index.rows["id"][r] for r in rows]
            texts = [index.rows["text"][r] for r in rows]
            vectors = [index.vectors[rows]] if len(rows) else []
            live = [
                i
                for i, row in enumerate(overlay.rows)
                if row["kind"] == "fact"
                and owner_key(row["user_id"], row["conversation_id"]) == owner
            ]
            ids += [overlay.rows[i]["id"] for i in live]
            texts += [overlay.rows[i]["text"] for i in live]
            if live:
                vectors.append(overlay.vectors[live])
            dims = self.provider.dims
            stacked = np.vstack(vectors) if vectors else np.zeros((0, dims), dtype=np.float32)
            self._fact_sets[owner] = FactSet(ids, texts, stacked)
        return self._fact_sets[owner]

    def _published_facts(self, owner: str) -> np.ndarray:
        index = self.index
        kind_codes, kinds = index.codes["kind"]
        if "fact" not in kinds:
            return np.zeros(0, np.int64)
        user_id, conversation_id = owner_of(owner)
        user_codes, users = index.codes["user_id"]
        mask = (kind_codes == kinds["fact"]) & (user_codes == users.get(user_id, -1))
        if user_id is None:
            conversation_codes, conversations = index.codes["conversation_id"]
            mask &= conversation_codes == conversations.get(conversation_id, -1)
        rows = np.nonzero(mask)[0]
        return np.setdiff1d(rows, self.overlay.hidden_rows, assume_unique=True)


class LiveWriter(LiveView):
    """`MemoryWriter`'s interface over the live view (see the module doc).

    Its calls are collected (`ops` for the journal, `records` for the delta) and written by
    `LiveStore.writer()` when the block ends without an error.
    """

    def __init__(
        self, searcher: Searcher, *, actor: str = ACTOR, now: datetime | None = None
    ) -> None:
        super().__init__(searcher)
        manifest = self.index.manifest
        self.model = f"{manifest['provider']}/{manifest['model']}"
        self.actor = actor
        self.now = Clock(now)
        self.counts: dict[str, int] = {}
        self.ops: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        #: What each call did, for the caller's answer: (event, memory id, text, previous id).
        self.events: list[tuple[str, str, str, str | None]] = []

    def _count(self, key: str, amount: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    # ----------------------------------------------------------------- writes

    def add(
        self, memory: NewMemory, *, meta: dict[str, Any] | None = None, memory_id: str | None = None
    ) -> str:
        check_category(memory.category)
        memory_id = memory_id or new_memory_id(memory.kind)
        now = self._op("add", memory_id=memory_id, memory=memory, meta=meta)
        row = memory_row(memory_id, memory, now)
        self._put(row, "created")
        self._count(f"{memory.kind}_added")
        self.events.append(("ADD", memory_id, memory.content, None))
        return memory_id

    def replace(
        self,
        old_id: str,
        memory: NewMemory,
        *,
        meta: dict[str, Any] | None = None,
        memory_id: str | None = None,
    ) -> str:
        old = self.active(old_id)
        check_category(memory.category)
        memory_id = memory_id or new_memory_id(memory.kind)
        now = self._op("replace", old_id=old_id, memory_id=memory_id, memory=memory, meta=meta)
        gone = {**old, "state": "soft_deleted", "valid_until": now, "replaced_by": memory_id}
        self._drop(gone, "replaced", by=memory_id)
        row = {**memory_row(memory_id, memory, now), "supersedes": old_id}
        self._put(row, "updated", by=old_id)
        self._count(f"{memory.kind}_updated")
        self.events.append(("UPDATE", memory_id, memory.content, old_id))
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
        old = self.active(memory_id)
        now = self._op(
            "soft_delete",
            memory_id=memory_id,
            event=event,
            change=change,
            new_ref=new_ref,
            purge_after_days=purge_after_days,
            meta=meta,
        )
        purge_at = now + timedelta(days=purge_after_days) if purge_after_days else None
        gone = {**old, "state": "soft_deleted", "valid_until": now, "purge_at": purge_at}
        self._drop(gone, change, by=new_ref)
        self._count(f"{old['kind']}_{change}")
        self.events.append(("DELETE", memory_id, old["content"], None))

    def restore(self, memory_id: str, *, meta: dict[str, Any] | None = None) -> None:
        row = self.get(memory_id)
        if row is None:
            raise MemoryOpError(f"no memory {memory_id}")
        if row["valid_until"] is None and row["state"] == "active":
            raise MemoryOpError(f"memory {memory_id} is active: nothing to restore")
        replacement = self.get(row["replaced_by"]) if row["replaced_by"] else None
        if replacement is not None and replacement["state"] == "active":
            raise MemoryOpError(
                f"memory {memory_id} was replaced by {row['replaced_by']}, which is active: "
                "forget the replacement first"
            )
        self._op("restore", memory_id=memory_id, meta=meta)
        back = {**row, "state": "active", "valid_until": None, "purge_at": None}
        back["confidence"] = max(float(row["confidence"] or 0.0), 1.0)
        self._put(back, "restored")
        self._count(f"{row['kind']}_restored")
        self.events.append(("RESTORE", memory_id, row["content"], None))

    def confirm(self, memory_id: str, *, meta: dict[str, Any] | None = None) -> None:
        row = self.active(memory_id)
        self._op("confirm", memory_id=memory_id, meta=meta)
        protected = {**row, "decay_rate": 0.0, "confidence": 1.0}
        self._rows[memory_id] = protected
        self.records.append(record(0, self.now(), "note", "confirmed", protected))
        self._count(f"{row['kind']}_confirmed")
        self.events.append(("CONFIRM", memory_id, row["content"], None))

    def history(
        self,
        memory_id: str,
        event: str,
        *,
        old_ref: str | None = None,
        new_ref: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self._op(
            "history", memory_id=memory_id, event=event, old_ref=old_ref, new_ref=new_ref, meta=meta
        )
        if event == "NONE":
            text = (meta or {}).get("new_text") or ""
            self.events.append(("NONE", memory_id, text, None))

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
        self._op(
            "record_event",
            node=node,
            op=op,
            status=status,
            conversation_id=conversation_id,
            memory_id=memory_id,
            detail=detail,
            meta=meta,
        )
        if status == "error":
            self._count("llm_failures" if op in ("extract", "reconcile") else "errors")

    def link_entities(self, items: Any) -> None:
        """Entities are linked when the pipeline folds the journal (`MemoryWriter.add`)."""

    def propose(self, change: ChangeRequest) -> None:
        """A consent proposal (`consent.py`), queued in DuckDB by the fold."""
        self._op("propose", change=dataclasses.asdict(change))
        self._count("facts_proposed")

    def record_turn(self, turn: LiveTurn) -> None:
        """A transcript line written live: searchable as a turn until the pipeline indexes it."""
        now = self._op("turn", turn=dataclasses.asdict(turn))
        row = {
            "id": turn.episode_id,
            "kind": "episode",
            "content": turn.content,
            "path": turn.path,
            "turn_id": turn.turn_id,
            "conversation_id": turn.conversation_id,
            "session_id": turn.session_id,
            "user_id": turn.user_id,
            "source_role": turn.role,
            "speaker": turn.speaker,
            "event_time": turn.event_time,
            "created_at": now,
            "state": "active",
        }
        search = {
            "id": turn.episode_id,
            "kind": "transcript",
            "source": "sessions",
            "path": turn.path,
            "start_line": turn.line,
            "end_line": turn.line,
            "text": turn.text,
            "search_text": turn.search_text,
            "speaker": turn.speaker,
            "turn_ids": [turn.turn_id],
            "conversation_id": turn.conversation_id,
            "session_id": turn.session_id,
            "event_time": turn.event_time,
            "role": turn.role,
            "category": None,
            "user_id": None,  # turns are shared by their conversation (scope.py)
            "agent_id": None,
            "importance": None,
            "pinned": False,
            "updated_at": now,
        }
        vector = self.embed([turn.search_text])[0]
        self.records.append(
            record(0, now, "put", None, row, search=search, vector=vector, model=self.model)
        )

    # ----------------------------------------------------------------- internals

    def _op(self, call: str, **fields: Any) -> datetime:
        now = self.now()
        data = {
            k: dataclasses.asdict(v) if isinstance(v, NewMemory) else v for k, v in fields.items()
        }
        self.ops.append({"call": call, "at": now.isoformat(), **data})
        return now

    def _put(self, row: dict[str, Any], event: str, by: str | None = None) -> None:
        self._rows[row["id"]] = row
        search = vector = None
        if row["kind"] in SEARCHED_KINDS:
            search = search_row(row)
            vector = self.embed([row["content"]])[0]
        if row["kind"] == "fact":
            facts = self.facts(owner_key(row["user_id"], row["conversation_id"]))
            facts.remove(row["id"])
            facts.add(row["id"], row["content"], self.embed([row["content"]])[0])
        at = row["created_at"] if event != "restored" else self.now()
        self.records.append(
            record(0, at, "put", event, row, search=search, vector=vector, model=self.model, by=by)
        )

    def _drop(self, row: dict[str, Any], event: str, by: str | None = None) -> None:
        self._rows[row["id"]] = row
        if row["kind"] == "fact":
            self.facts(owner_key(row["user_id"], row["conversation_id"])).remove(row["id"])
        self.records.append(record(0, row["valid_until"], "drop", event, row, by=by))


class LiveConsentGate(ConsentGate):
    """The consent gate of a live write: a proposal is journaled and queued by the fold."""

    writer: LiveWriter  # type: ignore[assignment]

    def propose(self, change: ChangeRequest) -> str | None:
        self.writer.propose(change)
        return None


class LiveStore:
    """The live write path of one store: its journal, its delta segment, one lock.

    `Memory` keeps one per store; `writer()` is the transaction of one live write.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.journal = Journal(Path(settings.workspace))
        self.index_dir = Path(settings.index_dir)

    @contextmanager
    def writer(
        self, *, actor: str = ACTOR, scope: Scope | None = None, now: datetime | None = None
    ) -> Iterator[LiveWriter]:
        """Hold the lock, yield a writer over the current version and delta, then append its
        batch to the journal and its records to the delta (nothing when the block raised)."""
        with self.journal.lock():
            self._catch_up()
            searcher = get_searcher(self.settings)
            if scope is not None:
                scope.check_store(searcher.store_users())
            writer = LiveWriter(searcher, actor=actor, now=now)
            yield writer
            self._commit(writer)

    def _commit(self, writer: LiveWriter) -> int | None:
        if not writer.ops:
            return None
        seq = self.journal.append(writer.ops, actor=writer.actor, at=writer.now())
        append_records(self.index_dir, _numbered(writer, seq))
        path = delta_path(self.index_dir)
        if path.stat().st_size > COMPACT_BYTES:
            compact(self.index_dir, writer.index)
        return seq

    def _catch_up(self) -> None:
        """Make sure the delta file exists and holds every batch (a crash between the journal
        and the delta leaves it behind: the missing batches are replayed into it)."""
        path = delta_path(self.index_dir)
        if not path.exists():  # searchers lay live writes over an empty index until the first build
            self.index_dir.mkdir(parents=True, exist_ok=True)
            path.touch()
        behind = last_seq(self.index_dir)
        if behind >= self.journal.last_seq():
            return
        from memory_dag.memories.fold import replay

        searcher = get_searcher(self.settings)
        after = max(behind, searcher.index.journal_seq)
        for batch in self.journal.read(after):
            writer = LiveWriter(get_searcher(self.settings), actor=batch.actor)
            replay(batch, writer)
            append_records(self.index_dir, _numbered(writer, batch.seq))


def _numbered(writer: LiveWriter, seq: int) -> list[dict[str, Any]]:
    """The writer's delta records under the batch's seq; a mark when it has none, so the
    delta's last seq always equals the journal's (`_catch_up` compares them)."""
    if not writer.records:
        return [record(seq, writer.now(), "mark", None, {})]
    return [{**r, "seq": seq} for r in writer.records]
