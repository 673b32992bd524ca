"""Messages written live: the transcript lines, the session switch, the facts of user turns.

`Memory.add(messages)` (and the proxy, after an answer) calls `record_messages`. Under the live
store's lock it picks the session (`transcripts.SessionState`: a new one closes the previous
one and records a `sessions`/`switch` event), appends the turns to the transcript, records them
for the delta (searchable at once), and runs the write path's per-turn step on the user turns
(`write_path.write_turns` on the `LiveWriter`: extraction, seed 003 §9 checks, dedup,
reconciliation, consent gate), then records the turns it examined (`facts`/`observe`, as the
pipeline does for an open session), so the pipeline never extracts them again.

With an LLM, extraction runs before the lock (a slow model never holds other writers up);
reconciliation, which needs the owner's facts as they stand, runs under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memory_dag.llm import LLMClient
from memory_dag.memories.live_writer import LiveConsentGate, LiveStore
from memory_dag.memories.sessions import NODE
from memory_dag.memories.transcripts import (
    SessionState,
    append_turns,
    session_key,
    transcript_path,
)
from memory_dag.memories.write_path import UserTurn, extract_turns, write_turns
from memory_dag.scope import Scope


@dataclass
class Recorded:
    """What `record_messages` wrote: the writer's events (event, memory id, text, previous
    id), the turns' episode ids, their session and the session it closed."""

    events: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    session_id: str = ""
    closed: str | None = None


def record_messages(
    live: LiveStore,
    turns: list[dict[str, Any]],
    scope: Scope,
    *,
    llm: LLMClient | None,
    infer: bool,
    at: datetime,
    idle_seconds: float,
    actor: str,
) -> Recorded:
    """Write `turns` (normalised messages, `transcripts.normalise_messages`) for the scope's
    conversation, user and session (`scope.run_id`, else the current one); see module doc."""
    conversation_id, user_id = scope.conversation_id, scope.user_id
    extracted = None
    if infer and llm is not None:  # LLM calls before the lock, never while holding it
        provisional = [_unplaced(turn, position) for position, turn in enumerate(turns)]
        extracted = extract_turns(llm, [t for t in provisional if t.role == "user"])
    with live.writer(actor=actor, scope=scope, now=at) as writer:
        sessions = SessionState(live.settings.workspace)
        key = session_key(conversation_id, user_id)
        choice = sessions.choose(key, scope.run_id, at, idle_seconds)
        path = transcript_path(conversation_id, choice.session_id)
        if choice.closed is not None:
            writer.record_event(
                "sessions", "switch", "ok", conversation_id=conversation_id,
                detail=f"session {choice.closed} closed by {choice.session_id}",
                meta={"closed": choice.closed, "opened": choice.session_id, "path": path},
            )  # fmt: skip
        recorded = append_turns(
            live.settings.workspace, path, turns, conversation_id=conversation_id,
            session_id=choice.session_id, user_id=user_id, at=at,
        )  # fmt: skip
        for turn in recorded:
            writer.record_turn(turn)
        if infer:
            said = [
                UserTurn(t.episode_id, t.turn_id, t.path, t.conversation_id, t.session_id,
                         t.speaker, t.role, t.content, t.event_time, t.user_id)
                for t in recorded if t.role == "user"
            ]  # fmt: skip
            keyed = None
            if extracted is not None:
                keyed = {t.key: found for t, found in zip(said, extracted, strict=True)}
            turn_writer = write_turns(
                writer, said, llm=llm, extracted=keyed, gate=LiveConsentGate(writer)
            )
            failed = set(turn_writer.failed)
            writer.record_event(
                NODE, "observe", "ok", conversation_id=conversation_id, detail=path,
                meta={"path": path, "session_id": choice.session_id,
                      "method": turn_writer.method, "facts_written": len(turn_writer.written),
                      "turns": [t.key for t in said if t.key not in failed]},
            )  # fmt: skip
        sessions.record(key, choice.session_id, at)
    return Recorded(
        events=writer.events,
        turns=[t.episode_id for t in recorded],
        session_id=choice.session_id,
        closed=choice.closed,
    )


def _unplaced(turn: dict[str, Any], position: int) -> UserTurn:
    """A turn before it has a place in a transcript (for extraction ahead of the lock)."""
    return UserTurn(
        f"pending-{position}", f"pending-{position}", "", None, None, turn.get("name"),
        turn["role"], turn["content"], None,
    )  # fmt: skip
