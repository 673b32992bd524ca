"""Sessions (seed 004 `sessions_consolidations`) and the session sensor's view of transcripts.

Every transcript file is a session, registered the first time the write path sees it
(`first_seen_at`). Within a conversation the sessions are ordered by first sight, then by their
first turn's time, then by file name (session_2 before session_10); the newest one is the open,
live session. Its new turns are examined as they arrive (`write_path`, op `observe`);
consolidation closes every registered, unconsolidated session except that open one
(`include_open=True` closes it too: the nightly or "end of conversation" run). A consolidated
session is never consolidated again, and a run with nothing new changes nothing.

A session whose transcript changes after consolidation (the file hash differs from the one
recorded when it was consolidated) is reopened. Its next consolidation examines only user turns
not examined before: new turns and edited turns (a turn is identified by its episode id and the
hash of its text). Facts drawn from turns that were later edited or removed stay: they were said,
and later statements reconcile with them like any other. Turns already examined are never fed
to extraction again, so an old statement cannot come back and overrule a newer one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory_dag.ingest.watch import scan_workspace
from memory_dag.store.connection import fetch_dicts

if TYPE_CHECKING:  # the sessions sensor imports this module: no Polars/NumPy in the daemon
    from memory_dag.memories.writer import MemoryWriter

#: The `events` node of the write path.
NODE = "facts"


@dataclass(frozen=True)
class Session:
    """A registered transcript file and where it stands."""

    path: str
    session_id: str
    conversation_id: str | None
    first_seen_at: datetime
    consolidated_at: datetime | None
    file_hash: str
    first_event: datetime | None


# --------------------------------------------------------------------------- sessions


def register_sessions(con: Any, now: datetime) -> int:
    """Register every transcript the store knows and the write path has not seen yet."""
    row = con.execute(
        "INSERT INTO sessions_consolidations (path, session_id, conversation_id, first_seen_at) "
        "SELECT path, session_id, conversation_id, ? FROM files WHERE kind = 'transcript' "
        "AND path NOT IN (SELECT path FROM sessions_consolidations)",
        [now],
    ).fetchone()
    return int(row[0]) if row else 0


def reopen_changed_sessions(writer: MemoryWriter) -> list[str]:
    """Consolidated sessions whose transcript changed since: pending again (see module doc)."""
    rows = writer.con.execute(
        """
        WITH last AS (
            SELECT json_extract_string(meta, '$.path') AS path,
                   arg_max(json_extract_string(meta, '$.file_hash'), ts) AS file_hash
            FROM events WHERE node = ? AND op = 'consolidate' GROUP BY 1)
        SELECT s.path, s.conversation_id, f.hash
        FROM sessions_consolidations s
        JOIN files f ON f.path = s.path
        LEFT JOIN last l ON l.path = s.path
        WHERE s.consolidated_at IS NOT NULL AND l.file_hash IS DISTINCT FROM f.hash
        ORDER BY s.path
        """,
        [NODE],
    ).fetchall()
    for path, conversation_id, file_hash in rows:
        writer.con.execute(
            "UPDATE sessions_consolidations SET consolidated_at = NULL WHERE path = ?", [path]
        )
        writer.record_event(
            NODE,
            "reopen",
            "ok",
            conversation_id=conversation_id,
            detail=f"{path} changed after consolidation: new and edited turns will be examined",
            meta={"path": path, "file_hash": file_hash},
        )
    return [row[0] for row in rows]


def _natural(text: str) -> tuple[Any, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def session_order(session: Session) -> tuple[Any, ...]:
    """Older first: first sight, then first turn time (untimed last), then natural file name."""
    never = datetime.min.replace(tzinfo=UTC)
    return (
        session.first_seen_at,
        session.first_event is None,
        session.first_event or never,
        _natural(session.path),
    )


def load_sessions(con: Any) -> list[Session]:
    """Registered sessions whose transcript still exists, by conversation, oldest first."""
    rows = fetch_dicts(
        con,
        """
        SELECT s.path, s.session_id, s.conversation_id, s.first_seen_at, s.consolidated_at,
               f.hash AS file_hash,
               (SELECT min(m.event_time) FROM memories m
                WHERE m.kind = 'episode' AND m.path = s.path) AS first_event
        FROM sessions_consolidations s JOIN files f ON f.path = s.path
        """,
    )
    sessions = [Session(**row) for row in rows]
    return sorted(sessions, key=lambda s: (s.conversation_id or "", session_order(s)))


def sessions_due(sessions: list[Session], include_open: bool) -> list[Session]:
    """Pending sessions to consolidate now: all but each conversation's newest, unless asked."""
    newest: dict[str, Session] = {}
    for session in sessions:  # sorted oldest first, so the last one seen wins
        newest[session.conversation_id or ""] = session
    return [
        s
        for s in sessions
        if s.consolidated_at is None
        and (include_open or newest[s.conversation_id or ""].path != s.path)
    ]


# --------------------------------------------------------------------------- the sensor's view

SessionFiles = dict[str, list]  # rel_path -> [size, mtime, sha256, first-seen sequence]


@dataclass
class SessionFileChanges:
    """Session files that appeared or changed, and the conversations that need a run."""

    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    settling: list[str] = field(default_factory=list)
    conversations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = f"{len(self.new)} new and {len(self.changed)} changed session files"
        return text + (f", {len(self.settling)} still being written" if self.settling else "")


def conversation_of(rel_path: str) -> str:
    """The conversation folder of `sessions/<conversation>/<session>.jsonl` ('' at the root)."""
    return "/".join(rel_path.split("/")[1:-1])


def scan_sessions(
    workspace: Path,
    previous: SessionFiles,
    *,
    debounce_seconds: float = 1.5,
    now: float | None = None,
) -> tuple[SessionFileChanges, SessionFiles]:
    """Compare the transcripts with `previous` (filesystem only: sensors never open DuckDB).

    A conversation needs a consolidation run when it gains a session file (the older sessions
    are now closed) or when one of its sessions other than the newest (by first sight) changes
    (a consolidated transcript was edited). Changes to the newest, live session do not count:
    it is consolidated when the next session starts.
    """
    files, seen = scan_workspace(
        workspace,
        {key: entry[:3] for key, entry in previous.items()},
        debounce_seconds=debounce_seconds,
        now=now,
    )

    def transcripts(keys: list[str]) -> list[str]:
        return [k for k in keys if k.startswith("sessions/") and k.endswith(".jsonl")]

    changes = SessionFileChanges(
        new=transcripts(files.new),
        changed=transcripts(files.changed),
        settling=transcripts(files.settling),
    )
    # Each session keeps the sequence number of when it was first seen.
    sequence = max((entry[3] for entry in previous.values()), default=0) + 1
    state: SessionFiles = {}
    for key in transcripts(sorted(seen)):
        before = previous.get(key)
        if before is None:
            state[key] = [*seen[key], sequence]
            sequence += 1
        else:
            state[key] = [*seen[key], before[3]]
    newest: dict[str, str] = {}
    for key in sorted(state, key=lambda k: (state[k][3], _natural(k))):
        newest[conversation_of(key)] = key
    wanted = {conversation_of(key) for key in changes.new}
    wanted |= {conversation_of(k) for k in changes.changed if newest.get(conversation_of(k)) != k}
    changes.conversations = sorted(wanted)
    return changes, state


def sessions_fingerprint(state: SessionFiles, conversations: list[str]) -> str:
    """One version of these conversations' transcripts: the sensor's run key."""
    digest = hashlib.sha256()
    chosen = set(conversations)
    for key in sorted(state):
        if conversation_of(key) in chosen:
            digest.update(f"{key}\x00{state[key][2]}\n".encode())
    return digest.hexdigest()[:24]
