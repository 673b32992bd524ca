"""The fold: live writes (the journal) into the DuckDB store, each exactly once.

A live write recorded `MemoryWriter` calls in the journal (`live_writer.py`); the fold replays
them on a real `MemoryWriter`, with the memory ids and times the live write chose, so the store
gets the same history, change log, entity links, relations and consent proposals as if the
call had run on it. The position (`store_meta.journal_seq`) is written in the same transaction
as the replayed calls: a crash replays nothing twice and loses nothing.

It runs first in the facts asset (`write_path.consolidate`) and in `memory-dag ingest
--no-dagster`, before the turns of the open sessions are examined: the turns a live write
already examined carry its `observe` event, so they are never extracted again. The next index
build records the position in its manifest, and readers stop laying those batches over it.

A call that no longer applies (its memory was decayed or purged since, or an id already
exists) is skipped and counted; the batch's other calls still apply.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.memories.consent import ConsentGate
from memory_dag.memories.journal import JOURNAL_SEQ_KEY, Batch, Journal
from memory_dag.memories.live_writer import (
    LiveConsentGate,
    LiveTurn,
    LiveWriter,
    change_request,
    new_memory,
)
from memory_dag.memories.writer import MemoryWriter
from memory_dag.reports import StageReport
from memory_dag.store.connection import get_meta, open_store, set_meta

ACTOR = "live"


def fold_journal(settings: Settings, *, now: datetime | None = None) -> StageReport:
    """Replay the journal's batches after the store's position; one transaction."""
    report = StageReport("live_writes")
    started = time.perf_counter()
    journal = Journal(settings.workspace)
    counts = {"batches": 0, "calls": 0, "skipped": 0}
    with open_store(settings.db_path) as con:
        folded = int(get_meta(con, JOURNAL_SEQ_KEY) or 0)
        # Under the live lock: a transcript line the files stage read has its batch written.
        with journal.lock():
            batches = list(journal.read(folded))
        if batches:
            writer = MemoryWriter(con, get_provider(settings), actor=ACTOR, now=now)
            with writer.transaction():
                for batch in batches:
                    skipped = replay(batch, writer)
                    counts["batches"] += 1
                    counts["calls"] += len(batch.ops)
                    counts["skipped"] += len(skipped)
                    for reason in skipped:
                        writer.record_event("live", "fold", "skipped", detail=reason,
                                            meta={"seq": batch.seq})  # fmt: skip
                set_meta(con, JOURNAL_SEQ_KEY, str(batches[-1].seq))
            for key in ("fact_added", "fact_updated", "fact_deleted", "fact_soft_deleted"):
                counts[key] = writer.counts.get(key, 0)
        counts["journal_seq"] = batches[-1].seq if batches else folded
    report.counts = counts
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def replay(batch: Batch, writer: Any) -> list[str]:
    """Make the batch's calls on `writer` (a `MemoryWriter`, or a `LiveWriter` rebuilding the
    delta); returns why calls were skipped."""
    skipped: list[str] = []
    for op in batch.ops:
        writer.now.move_to(datetime.fromisoformat(op["at"]))
        reason = _apply(op, writer)
        if reason is not None:
            skipped.append(f"{op['call']} {op.get('memory_id') or ''}: {reason}".strip())
    return skipped


def _active(row: dict[str, Any] | None) -> bool:
    return row is not None and row["valid_until"] is None and row["state"] == "active"


def _apply(op: dict[str, Any], writer: Any) -> str | None:
    """One call; the reason it no longer applies, or None when it was made."""
    call = op["call"]
    memory_id = op.get("memory_id")
    meta = op.get("meta")
    if call in ("add", "replace") and writer.get(memory_id) is not None:
        return "already written"
    if call == "add":
        writer.add(new_memory(op["memory"]), meta=meta, memory_id=memory_id)
    elif call == "replace":
        memory = new_memory(op["memory"])
        if _active(writer.get(op["old_id"])):
            writer.replace(op["old_id"], memory, meta=meta, memory_id=memory_id)
        else:  # the old version went meanwhile: the new one still stands on its own
            writer.add(memory, meta={**(meta or {}), "replaces": op["old_id"]}, memory_id=memory_id)
    elif call in ("soft_delete", "confirm"):
        if not _active(writer.get(memory_id)):
            return "no longer active"
        if call == "confirm":
            writer.confirm(memory_id, meta=meta)
        else:
            writer.soft_delete(
                memory_id,
                event=op["event"],
                change=op["change"],
                new_ref=op["new_ref"],
                purge_after_days=op["purge_after_days"],
                meta=meta,
            )
    elif call == "restore":
        row = writer.get(memory_id)
        replacement = writer.get(row["replaced_by"]) if row and row["replaced_by"] else None
        if row is None or _active(row) or _active(replacement):
            return "not restorable any more"
        writer.restore(memory_id, meta=meta)
    elif call == "history":
        writer.history(
            memory_id, op["event"], old_ref=op["old_ref"], new_ref=op["new_ref"], meta=meta
        )
    elif call == "record_event":
        fields = ("conversation_id", "memory_id", "detail", "meta")
        writer.record_event(op["node"], op["op"], op["status"], **{k: op[k] for k in fields})
    elif call == "propose":
        change = change_request(op["change"])
        if not _active(writer.get(change.memory_id)):
            return "the fact the change was for is no longer active"
        _gate(writer).propose(change)
    elif call == "turn" and isinstance(writer, LiveWriter):  # the store reads the transcript
        turn = dict(op["turn"])
        turn["event_time"] = datetime.fromisoformat(turn["event_time"])
        writer.record_turn(LiveTurn(**turn))
    return None


def _gate(writer: Any) -> ConsentGate:
    return LiveConsentGate(writer) if isinstance(writer, LiveWriter) else ConsentGate(writer)
