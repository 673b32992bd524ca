"""The journal: memory writes made live, the source of truth the pipeline folds into DuckDB.

A live write (`Memory.add`, `update`, `delete`, the service, the CLI) cannot always open the
DuckDB file: it has one writer process, and a pipeline run may hold it for minutes. So a live
write is a *batch* of writer calls (`live_writer.LiveWriter` records the calls `MemoryWriter`
would make: add, replace, soft_delete, restore, confirm, history, events, consent proposals,
the turns a transcript line recorded) appended to the journal in the workspace:

    <workspace>/journal/
      .lock                    fcntl lock: one live writer at a time, across processes
      000000000001.jsonl       one batch per line: {"seq", "at", "actor", "ops": [...]}
      000000004097.jsonl       a new segment (named by its first seq) every SEGMENT_BYTES
      sessions.json            each conversation's current session (`transcripts.py`)

A batch is one line written with one `write` and fsynced before the call returns: durable, and
whole or absent (a torn last line, from a crash mid-write, is cut by the next writer and never
read). Sequence numbers only grow. The pipeline's fold (`fold.py`) replays the batches after the
store's `journal_seq` through `MemoryWriter`, and records the new position in the same
transaction, so each batch is applied exactly once. Segments are kept (like transcripts): a
store rebuilt from the workspace replays them.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: `store_meta` key of the last batch folded into the store (`fold.py`).
JOURNAL_SEQ_KEY = "journal_seq"
#: Folder of the journal inside the workspace.
JOURNAL_FOLDER = "journal"
#: A segment is closed once it is this large; the next batch starts a new one.
SEGMENT_BYTES = 8 * 1024 * 1024
#: How far from the end of a segment its last batch is looked for.
_TAIL_BYTES = 1024 * 1024


def journal_dir(workspace: Path) -> Path:
    """The journal folder of a workspace."""
    return Path(workspace) / JOURNAL_FOLDER


@dataclass
class Batch:
    """One live write: the writer calls of one transaction, in order."""

    seq: int
    at: datetime
    actor: str
    ops: list[dict[str, Any]] = field(default_factory=list)

    def to_line(self) -> bytes:
        record = {"seq": self.seq, "at": self.at.isoformat(), "actor": self.actor, "ops": self.ops}
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=_plain)
        return (text + "\n").encode("utf-8")

    @classmethod
    def from_line(cls, line: bytes) -> Batch:
        record = json.loads(line)
        return cls(
            seq=int(record["seq"]),
            at=datetime.fromisoformat(record["at"]),
            actor=str(record.get("actor") or "live"),
            ops=list(record.get("ops") or []),
        )


def _plain(value: Any) -> Any:
    """JSON for what `json` does not know: times as ISO text, sets and tuples as lists."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    return str(value)


class Journal:
    """The journal of one workspace. Writers call `append` while holding `lock()`."""

    def __init__(self, workspace: Path) -> None:
        self.folder = journal_dir(workspace)

    # ----------------------------------------------------------------- the lock

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One live writer at a time, across processes (an fcntl lock on `.lock`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            os.close(descriptor)

    # ----------------------------------------------------------------- segments

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.glob("*.jsonl") if p.stem.isdigit())

    def last_seq(self) -> int:
        """The sequence number of the last whole batch (0 for an empty journal)."""
        segments = self.segments()
        if not segments:
            return 0
        last = segments[-1]
        with open(last, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _TAIL_BYTES))
            tail = handle.read()
        for line in reversed(tail.split(b"\n")):
            if line.strip():
                try:
                    return Batch.from_line(line).seq
                except (ValueError, KeyError):
                    continue  # a torn line: the batch before it is the last whole one
        return int(last.stem) - 1

    # ----------------------------------------------------------------- writing

    def append(self, ops: list[dict[str, Any]], *, actor: str, at: datetime | None = None) -> int:
        """Append one batch and fsync it; returns its sequence number. Call under `lock()`."""
        seq = self.last_seq() + 1
        batch = Batch(seq, at or datetime.now(UTC), actor, ops)
        segment = self._segment_for(seq)
        self._cut_torn_tail(segment)
        write_durably(segment, batch.to_line())
        return seq

    def _segment_for(self, seq: int) -> Path:
        segments = self.segments()
        if segments and segments[-1].stat().st_size < SEGMENT_BYTES:
            return segments[-1]
        segment = self.folder / f"{seq:012d}.jsonl"
        segment.touch()
        _fsync_folder(self.folder)  # the new file's name must survive a crash too
        return segment

    @staticmethod
    def _cut_torn_tail(segment: Path) -> None:
        """Remove a last line without its newline (a batch a crash left half-written)."""
        size = segment.stat().st_size
        if size == 0:
            return
        with open(segment, "rb+") as handle:
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return
            handle.seek(max(0, size - _TAIL_BYTES))
            tail = handle.read()
            cut = tail.rfind(b"\n")
            handle.truncate(size - len(tail) + cut + 1 if cut >= 0 else max(0, size - len(tail)))
            os.fsync(handle.fileno())

    # ----------------------------------------------------------------- reading

    def read(self, after: int = 0) -> Iterator[Batch]:
        """The whole batches with seq > `after`, in order (a torn last line is skipped)."""
        segments = self.segments()
        for position, segment in enumerate(segments):
            following = segments[position + 1] if position + 1 < len(segments) else None
            if following is not None and int(following.stem) <= after + 1:
                continue  # every batch of this segment is at or before `after`
            with open(segment, "rb") as handle:
                for line in handle:
                    if not line.endswith(b"\n"):
                        break  # torn: never applied
                    if not line.strip():
                        continue
                    batch = Batch.from_line(line)
                    if batch.seq > after:
                        yield batch


def write_durably(path: Path, data: bytes) -> None:
    """Append `data` to `path` with one write and fsync it before returning."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


#: The history event each journal call becomes when the fold replays it.
_CALL_EVENTS = {"add": "ADD", "restore": "RESTORE", "confirm": "CONFIRM", "propose": "PROPOSE"}


def pending_history(workspace: Path, memory_ids: set[str], after: int) -> list[dict[str, Any]]:
    """The history rows (`MemoryWriter`'s) that batches after `after` will write about these
    memories once folded: `{"at", "event", "memory_id", "old_ref", "new_ref", "actor", "meta"}`."""
    rows: list[dict[str, Any]] = []
    for batch in Journal(workspace).read(after):
        for op in batch.ops:
            row = _history_of(op, memory_ids)
            if row is not None:
                rows.append({"at": op["at"], "actor": batch.actor, **row})
    return rows


def _history_of(op: dict[str, Any], memory_ids: set[str]) -> dict[str, Any] | None:
    call = op["call"]
    if call == "replace" and memory_ids & {op["old_id"], op["memory_id"]}:
        return {"event": "UPDATE", "memory_id": op["old_id"], "old_ref": op["old_id"],
                "new_ref": op["memory_id"], "meta": op.get("meta") or {}}  # fmt: skip
    if call == "propose" and op["change"]["memory_id"] in memory_ids:
        change = op["change"]
        return {"event": "PROPOSE", "memory_id": change["memory_id"],
                "meta": {"field": change["field"], "text": change["proposed_text"]}}  # fmt: skip
    memory_id = op.get("memory_id")
    if memory_id not in memory_ids or call not in (*_CALL_EVENTS, "soft_delete", "history"):
        return None
    return {
        "event": op.get("event") if call in ("soft_delete", "history") else _CALL_EVENTS[call],
        "memory_id": memory_id,
        "old_ref": op.get("old_ref"),
        "new_ref": op.get("new_ref") or (memory_id if call == "add" else None),
        "meta": op.get("meta") or {},
    }
