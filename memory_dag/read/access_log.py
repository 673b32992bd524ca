"""Access tracking off the hot path: the ids of returned memories go to queue files beside
the store, and a pipeline step (`apply_access_log`) adds them to `access_count` /
`last_accessed`. A read never writes to DuckDB, whose single writer may be busy.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.paths import resolved
from memory_dag.store.connection import insert_arrow, listed, open_store, to_json


def access_log_dir(settings: Settings) -> Path:
    """Queue folder next to the store: `data/memory.duckdb` → `data/memory.access/`."""
    db_path = Path(settings.db_path)
    return db_path.with_name(db_path.stem + ".access")


class AccessLog:
    """Buffers the ids of returned memories; a daemon thread writes them to queue files.

    A read must not wait for the store's single writer, so `record` only appends to a list.
    The thread (and `atexit`) writes each batch as its own JSON-lines file, renamed into
    place so `apply_access_log` never sees half a file. Counting happens at the next
    pipeline run (`apply_access_log`), which is also the only writer.
    """

    def __init__(self, folder: Path, *, flush_seconds: float = 2.0) -> None:
        self.folder = folder
        self.flush_seconds = flush_seconds
        self._pending: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        atexit.register(self.flush)

    def record(self, memory_ids: Iterable[str], at: datetime | None = None) -> None:
        stamp = (at or datetime.now(UTC)).isoformat()
        with self._lock:
            self._pending.extend((memory_id, stamp) for memory_id in memory_ids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="memory-access-log", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.flush_seconds)  # gather a batch
            self._wake.clear()
            self.flush()

    def flush(self) -> int:
        """Write what is buffered as one queue file; returns the number of accesses written."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return 0
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging = self.folder / f".{name}.tmp"
        staging.write_text("".join(json.dumps({"id": i, "at": t}) + "\n" for i, t in batch))
        os.replace(staging, self.folder / f"{name}.jsonl")
        return len(batch)


_access_logs: dict[Path, AccessLog] = {}
_access_logs_lock = threading.Lock()


def get_access_log(settings: Settings) -> AccessLog:
    """One access log per store and process."""
    folder = resolved(access_log_dir(settings))
    with _access_logs_lock:
        log = _access_logs.get(folder)
        if log is None:
            log = _access_logs[folder] = AccessLog(folder)
        return log


def apply_access_log(settings: Settings) -> dict[str, int]:
    """Add the queued accesses to `memories.access_count` / `last_accessed` (a pipeline step).

    Exactly once: each queue file's name is recorded in `events` (node 'retrieval', op
    'access') in the same transaction as its counts, and files already recorded are skipped.
    """
    folder = access_log_dir(settings)
    files = sorted(folder.glob("*.jsonl")) if folder.exists() else []
    counts = {"files": 0, "accesses": 0, "memories": 0}
    if not files:
        return counts
    with open_store(settings.db_path) as con:
        with listed(con, "_access_files", [f.name for f in files]):
            done = {
                row[0]
                for row in con.execute(
                    "SELECT detail FROM events WHERE node = 'retrieval' AND op = 'access' "
                    "AND detail IN (SELECT value FROM _access_files)"
                ).fetchall()
            }
        todo = [f for f in files if f.name not in done]
        ids: list[str] = []
        stamps: list[datetime] = []
        for path in todo:
            for line in path.read_text().splitlines():
                record = json.loads(line)
                ids.append(record["id"])
                stamps.append(datetime.fromisoformat(record["at"]))
        accesses = pa.table({"id": pa.array(ids, pa.string()), "accessed_at": pa.array(stamps)})
        con.execute("BEGIN TRANSACTION")
        try:
            con.register("_accesses", accesses)
            updated = con.execute(
                """
                UPDATE memories SET
                    access_count = access_count + a.n,
                    last_accessed = greatest(coalesce(memories.last_accessed, a.latest), a.latest)
                FROM (SELECT id, count(*) AS n, max(accessed_at) AS latest
                      FROM _accesses GROUP BY id) a
                WHERE memories.id = a.id
                """
            ).fetchone()[0]
            con.unregister("_accesses")
            events = pa.table(
                {
                    "id": [uuid.uuid4().hex for _ in todo],
                    "node": ["retrieval"] * len(todo),
                    "op": ["access"] * len(todo),
                    "status": ["ok"] * len(todo),
                    "detail": [f.name for f in todo],
                    "meta": [to_json({"accesses": len(ids)})] * len(todo),
                }
            )
            insert_arrow(con, "events", events)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    for path in files:
        path.unlink(missing_ok=True)
    counts.update(files=len(todo), accesses=len(ids), memories=int(updated))
    return counts
