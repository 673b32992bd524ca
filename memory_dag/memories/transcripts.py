"""Transcript lines written live, and the session they belong to (seed 004's session switch).

A live write of messages appends one JSON line per turn to
`<workspace>/sessions/<conversation>/<session>.jsonl` (`sessions/<session>.jsonl` without a
conversation), the format the files stage ingests (`ingest/sources.py`), with an explicit turn
id, so the episode id the live write uses (`ids.episode_id(path, turn_id)`) is the one the
store gets. The line is fsynced before the journal batch that examined it is written.

Each conversation (or, without one, each user) has a current session, kept in
`journal/sessions.json`: the one named (`run_id`, the proxy's `X-Memory-Session`), else the
last one when its last turn is less than `idle_seconds` old, else a new one. Starting a new
session closes the previous one: the write records a `sessions`/`switch` event, and the new
session file is what the sessions sensor (`sensors/sessions.py`) watches to queue the
consolidation run of the closed one.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from memory_dag.ids import check_path_id, episode_id
from memory_dag.index.search_text import participant_names, strip_names, transcript_search_text
from memory_dag.ingest.limits import MAX_LINE_CHARS
from memory_dag.ingest.sources import KEPT_ROLES
from memory_dag.memories.journal import journal_dir, write_durably
from memory_dag.memories.live_writer import LiveTurn

#: A session id names a file: letters, digits and `._:-`, at most 128 characters.
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
#: A session whose last turn is older than this is closed by the next turn (seed 004).
DEFAULT_IDLE_SECONDS = 30 * 60
ROLES = ("user", "assistant")
STATE_FILE = "sessions.json"


def check_session_id(value: str) -> str:
    """`value` if it can name a session file, else ValueError."""
    if not SESSION_ID.match(value or "") or value.endswith(".jsonl"):
        raise ValueError(
            f"session id {value!r} cannot be used: use letters, digits and . _ : - "
            "(at most 128 characters)"
        )
    return value


def transcript_path(conversation_id: str | None, session_id: str) -> str:
    """The workspace-relative path of a session's transcript."""
    check_session_id(session_id)
    if conversation_id is None:
        return f"sessions/{session_id}.jsonl"
    return f"sessions/{check_path_id(conversation_id, 'conversation id')}/{session_id}.jsonl"


@dataclass(frozen=True)
class SessionChoice:
    """The session a write goes to, and the one it closed (None: none closed)."""

    session_id: str
    closed: str | None


class SessionState:
    """Each conversation's current session and when its last turn was written."""

    def __init__(self, workspace: Path) -> None:
        self.path = journal_dir(workspace) / STATE_FILE

    def _load(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def choose(
        self,
        key: str,
        requested: str | None,
        now: datetime,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
    ) -> SessionChoice:
        """The session for a write at `now` (call under the journal's lock)."""
        current = self._load().get(key)
        previous = current["session"] if current else None
        if requested is not None:
            session = check_session_id(requested)
        elif current and now - datetime.fromisoformat(current["last_at"]) < timedelta(
            seconds=idle_seconds
        ):
            session = current["session"]
        else:
            session = f"s{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
        return SessionChoice(session, previous if previous not in (None, session) else None)

    def record(self, key: str, session_id: str, at: datetime) -> None:
        """Remember the session's last turn (atomic replace; call under the journal's lock)."""
        state = self._load()
        state[key] = {"session": session_id, "last_at": at.isoformat()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(state, ensure_ascii=False, indent=0))
        os.replace(staging, self.path)


def session_key(conversation_id: str | None, user_id: str | None) -> str:
    """Whose current session: the conversation's, else the user's."""
    if conversation_id is not None:
        return f"conversation:{conversation_id}"
    return f"user:{user_id or ''}"


def append_turns(
    workspace: Path,
    path: str,
    messages: list[dict[str, Any]],
    *,
    conversation_id: str | None,
    session_id: str,
    user_id: str | None,
    at: datetime,
) -> list[LiveTurn]:
    """Append the messages (`{"role", "content", "name"?}`) as transcript lines, fsynced;
    returns them as the live writer records them. Call under the journal's lock."""
    file = Path(workspace) / path
    file.parent.mkdir(parents=True, exist_ok=True)
    line, previous, torn = _tail(file)
    turns: list[LiveTurn] = []
    lines: list[str] = ["\n"] if torn else []  # a torn last line stays a line of its own
    for position, message in enumerate(messages):
        line += 1
        turn_id = f"t{uuid.uuid4().hex[:16]}"
        when = at + timedelta(microseconds=position)
        speaker = message.get("name") or None
        record = {
            "id": turn_id,
            "role": message["role"],
            "content": message["content"],
            **({"name": speaker} if speaker else {}),
            "created_at": when.isoformat(),
            **({"user_id": user_id} if user_id is not None and message["role"] == "user" else {}),
        }
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        names = participant_names([speaker, previous[1] if previous else None])
        stripped = strip_names(message["content"], names)
        before = strip_names(previous[0], names) if previous else None
        turns.append(
            LiveTurn(
                episode_id=episode_id(path, turn_id),
                turn_id=turn_id,
                path=path,
                line=line,
                role=message["role"],
                speaker=speaker,
                content=message["content"],
                text=f"{speaker or message['role'].capitalize()}: {message['content']}",
                search_text=transcript_search_text(stripped, before),
                conversation_id=conversation_id,
                session_id=session_id,
                user_id=user_id if message["role"] == "user" else None,
                event_time=when,
            )
        )
        previous = (message["content"], speaker)
    write_durably(file, "".join(lines).encode("utf-8"))
    return turns


def normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style messages as transcript turns: user and assistant text only (system and
    tool messages are not memories of the user), whitespace collapsed; ValueError when a
    message is malformed or none is left."""
    if isinstance(messages, Mapping) or not isinstance(messages, Sequence):
        raise ValueError("messages must be a list of {'role', 'content'} objects (or a text)")
    turns: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {position} is not an object")
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            raise ValueError(f"message {position} has no 'role'")
        role = role.strip().lower()
        if role not in KEPT_ROLES:
            continue
        text = " ".join(_text_of(message.get("content"), position).split())
        if not text:
            continue
        if len(text) > MAX_LINE_CHARS:
            raise ValueError(f"message {position} is longer than {MAX_LINE_CHARS} characters")
        name = message.get("name")
        turn: dict[str, Any] = {"role": role, "content": text}
        if isinstance(name, str) and name.strip():
            turn["name"] = name.strip()
        turns.append(turn)
    if not turns:
        raise ValueError("no user or assistant message with text")
    return turns


def _text_of(content: Any, position: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"] if isinstance(part, dict) and isinstance(part.get("text"), str) else ""
            for part in content
        )
    raise ValueError(f"message {position}: 'content' must be text or a list of text parts")


def _tail(file: Path) -> tuple[int, tuple[str, str | None] | None, bool]:
    """(lines in the file, (content, speaker) of its last turn, whether its last line lacks
    its newline) for the lines appended next."""
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return 0, None, False
    torn = bool(data) and not data.endswith(b"\n")
    count = data.count(b"\n") + (1 if torn else 0)
    for raw in reversed(data.split(b"\n")):
        if raw.strip():
            try:
                last = json.loads(raw)
            except json.JSONDecodeError:
                break
            if isinstance(last, dict) and isinstance(last.get("content"), str):
                return count, (" ".join(last["content"].split()), last.get("name")), torn
            break
    return count, None, torn
