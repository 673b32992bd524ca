"""The consent queue (seed 003 §10): changes to user-context fields wait for the user.

Some facts set a *field* of the user's context (`field_of`): the preferred name ("Sam's name is
Sasha", "Sam goes by Sasha"), pronouns, the city ("Sam lives in Porto", "Sam moved to Porto"),
the language, the tone of answers ("Sam prefers short answers"). The policy in
`categories.yaml` (`consent:`) says which fields are sensitive and which benign.

When the write path would change such a fact, an UPDATE or a DELETE decided by reconciliation
(with the new fact that contradicts it), it does not apply the change. It queues a proposed
patch in `consent_queue` instead (history `PROPOSE` on the fact):

* sensitive fields (preferred name, pronouns, city, language): the patch waits
  `hold_days` (7) for `accept` (history `CONSENT`, then the usual UPDATE/DELETE) or `reject`
  (history `REJECT`); after that it expires (history `EXPIRE`, nightly lifecycle job);
* benign fields (tone): the patch applies by itself once `corroboration` (2) turns proposed the
  same change (history `CONSENT` decided by `corroboration`).

A field's first value is not a change: it is written at once. Explicit `correct` calls are the
caller's own edit and apply directly. `accept`, `reject` and `list_proposals` read through the
caller's `Scope`: a user decides only its own proposals.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from memory_dag.config import Settings
from memory_dag.ids import random_id
from memory_dag.memories.categories import ConsentPolicy, load_categories
from memory_dag.memories.facts import validate_fact
from memory_dag.memories.reconcile import Decision, normalise_text
from memory_dag.memories.relations import FactSet
from memory_dag.memories.writer import FACT_DECAY_RATE, MemoryOpError, MemoryWriter, NewMemory
from memory_dag.scope import Scope
from memory_dag.store.connection import fetch_dicts, open_store

_SUBJECT = r"(?:[Tt]he user|[A-Z][\w'-]*(?: [A-Z][\w'-]*){0,2})"
_TONES = (
    r"short|brief|long|detailed|concise|casual|formal|friendly|direct|plain|technical|simple|"
    r"informal|polite|funny|serious|warm"
)
#: field -> the shapes of a third-person fact that set it (the extractors' shapes).
FIELD_PATTERNS: dict[str, re.Pattern[str]] = {
    "preferred_name": re.compile(
        rf"^{_SUBJECT}(?:'s (?:preferred |full |first )?name is|'s nickname is|"
        rf" prefers to be called| goes by| wants to be called)\b"
    ),
    "pronouns": re.compile(rf"^{_SUBJECT}(?:'s pronouns are| uses \S+ pronouns)\b"),
    "city": re.compile(
        rf"^{_SUBJECT}(?: now| currently)? (?:lives|is living|is based|has moved|moved|"
        rf"has relocated|relocated) (?:back )?(?:in|to)\b|^{_SUBJECT}'s (?:home ?town|city) is\b"
    ),
    "language": re.compile(
        rf"^{_SUBJECT}(?:'s (?:preferred |native |first |main )?language is|"
        rf" prefers to (?:speak|write|talk|chat) in| prefers (?:answers|replies) in)\b"
    ),
    "tone": re.compile(
        rf"^{_SUBJECT}(?: now)? prefers (?:(?:\w+|,) )*?(?:{_TONES})\b.*\b(?:answers|replies|"
        rf"responses|messages|explanations)\b|^{_SUBJECT}'s preferred tone is\b|"
        rf"^{_SUBJECT} prefers an? \w+ tone\b"
    ),
}


def field_of(text: str) -> str | None:
    """The user-context field a fact sets, or None for an ordinary fact."""
    for name, pattern in FIELD_PATTERNS.items():
        if pattern.search(text.strip()):
            return name
    return None


def sensitivity(field: str | None, policy: ConsentPolicy) -> str | None:
    """`sensitive`, `benign`, or None when the policy leaves the field alone."""
    if field is None:
        return None
    if field in policy.sensitive:
        return "sensitive"
    if field in policy.benign:
        return "benign"
    return None


@dataclass
class Proposal:
    """One row of `consent_queue`."""

    id: str
    memory_id: str
    field: str
    sensitivity: str
    action: str
    current_text: str
    proposed_text: str | None
    user_id: str | None
    conversation_id: str | None
    status: str
    signals: int
    proposed_at: datetime
    expires_at: datetime
    decided_at: datetime | None = None
    decided_by: str | None = None
    result_id: str | None = None


@dataclass
class Held:
    """What `ConsentGate.hold` left: the decisions to apply now, how many changes it queued,
    and the facts written because a queued benign change was corroborated."""

    decisions: list[Decision]
    proposed: int = 0
    applied: list[str] = dataclasses.field(default_factory=list)


@dataclass
class ChangeRequest:
    """A change the write path wants to make to a field fact, with the turn that asked."""

    memory_id: str
    current_text: str
    proposed_text: str | None  # None: remove the fact
    field: str
    sensitivity: str
    memory: NewMemory  # the replacement as it would be written (content = proposed_text)


_COLUMNS = ", ".join(Proposal.__dataclass_fields__)


class ConsentGate:
    """Turns the write path's changes to field facts into proposals (inside its transaction)."""

    def __init__(self, writer: MemoryWriter, policy: ConsentPolicy | None = None) -> None:
        self.writer = writer
        self.policy = policy or load_categories().consent

    def field(self, text: str) -> tuple[str, str] | None:
        """(field, sensitivity) when changing a fact with this text needs the gate."""
        found = field_of(text)
        level = sensitivity(found, self.policy)
        return (found, level) if found is not None and level is not None else None

    def hold(
        self,
        decisions: list[Decision],
        owner: FactSet,
        replacement: Callable[[str, int | None], NewMemory],
    ) -> Held:
        """Take the write path's changes of field facts out of `decisions` and queue them: an
        UPDATE, a DELETE with the ADD that contradicts it, and an ADD of a field the owner's
        facts (`owner`) already set (a field holds one value). `replacement(text, fact_index)`
        is the fact the write path would write for a new text."""
        adds = [d for d in decisions if d.event == "ADD"]
        changes: list[tuple[list[Decision], str, Decision | None]] = []  # held, old id, by
        for decision in decisions:
            if decision.event in ("UPDATE", "DELETE") and decision.memory_id is not None:
                by = decision if decision.event == "UPDATE" else _contradicting(decision, adds)
                held = [decision] if by is None or by is decision else [decision, by]
                changes.append((held, decision.memory_id, by))
        claimed = {id(d) for held, _, _ in changes for d in held}
        for add in adds:
            gated = self.field(add.text) if id(add) not in claimed else None
            setting = [i for i, text in zip(owner.ids, owner.texts, strict=True)
                       if gated is not None and self.field(text) == gated]  # fmt: skip
            if setting:
                changes.append(([add], setting[-1], add))
        result = Held([])
        held_ids: set[int] = set()
        for held, memory_id, by in changes:
            current = self.writer.get(memory_id)
            gated = self.field(current["content"]) if current else None
            text = validate_fact(by.text) if by is not None else None
            if current is None or gated is None or (by is not None and text is None):
                continue  # not a field fact, or an invalid text the usual path counts
            index = by.fact_index if by is not None else None
            change = ChangeRequest(
                memory_id=memory_id,
                current_text=current["content"],
                proposed_text=text,
                field=gated[0],
                sensitivity=gated[1],
                memory=replacement(text or current["content"], index),
            )
            held_ids.update(id(d) for d in held)
            result.proposed += 1
            applied = self.propose(change)
            if applied is not None:
                result.applied.append(applied)
        result.decisions = [d for d in decisions if id(d) not in held_ids]
        return result

    def propose(self, change: ChangeRequest) -> str | None:
        """Queue the change (or add a signal to the same pending one); a benign change that
        now has enough signals is applied. Returns the new fact's id when applied."""
        con = self.writer.con
        now = self.writer.now()
        same = [
            row
            for row in fetch_dicts(
                con,
                f"SELECT {_COLUMNS}, source_ids FROM consent_queue WHERE memory_id = ? "
                "AND field = ? AND status = 'pending' AND expires_at > ?",
                [change.memory_id, change.field, now],
            )
            if normalise_text(row["proposed_text"] or "")
            == normalise_text(change.proposed_text or "")
        ]
        sources = list(change.memory.source_ids)
        if same:
            row = same[0]
            con.execute(
                "UPDATE consent_queue SET signals = signals + 1, "
                "source_ids = list_distinct(list_concat(source_ids, ?::TEXT[])) WHERE id = ?",
                [sources, row["id"]],
            )
            proposal_id, signals = row["id"], row["signals"] + 1
        else:
            proposal_id, signals = random_id("cns_"), 1
            self._insert(proposal_id, change, now)
        self.writer.history(
            change.memory_id,
            "PROPOSE",
            old_ref=change.memory_id,
            meta={
                "proposal": proposal_id,
                "field": change.field,
                "sensitivity": change.sensitivity,
                "text": change.proposed_text,
                "signals": signals,
                "source_ids": sources,
            },
        )
        if change.sensitivity == "benign" and signals >= self.policy.corroboration:
            return apply_proposal(self.writer, proposal_id, decided_by="corroboration")
        return None

    def _insert(self, proposal_id: str, change: ChangeRequest, now: datetime) -> None:
        memory = change.memory
        self.writer.con.execute(
            """
            INSERT INTO consent_queue (id, memory_id, field, sensitivity, action, current_text,
                proposed_text, user_id, conversation_id, session_id, speaker, source_role,
                category, importance, event_time, source_ids, signals, proposed_at, expires_at,
                status)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?::TEXT[], 1, ?, ?, 'pending')
            """,
            [
                proposal_id,
                change.memory_id,
                change.field,
                change.sensitivity,
                "replace" if change.proposed_text is not None else "remove",
                change.current_text,
                change.proposed_text,
                memory.user_id,
                memory.conversation_id,
                memory.session_id,
                memory.speaker,
                memory.source_role,
                memory.category,
                memory.importance,
                memory.event_time,
                list(memory.source_ids),
                now,
                now + timedelta(days=self.policy.hold_days),
            ],
        )


def _contradicting(deletion: Decision, adds: list[Decision]) -> Decision | None:
    """The ADD that contradicts a DELETE: the same new fact, else the only ADD."""
    same = [a for a in adds if a.fact_index is not None and a.fact_index == deletion.fact_index]
    if same:
        return same[0]
    return adds[0] if len(adds) == 1 else None


def apply_proposal(writer: MemoryWriter, proposal_id: str, *, decided_by: str) -> str | None:
    """Apply a pending proposal: replace (or remove) its fact; returns the new fact's id.

    A proposal whose fact changed meanwhile (no longer active) becomes `stale` instead.
    """
    row = _row(writer.con, proposal_id)
    target = writer.get(row["memory_id"])
    meta = {"op": "consent", "proposal": proposal_id, "field": row["field"]}
    status = "applied" if decided_by == "corroboration" else "accepted"
    result = None
    if target is None or target["state"] != "active" or target["valid_until"] is not None:
        status = "stale"
    elif row["action"] == "replace":
        memory = NewMemory(
            content=row["proposed_text"],
            kind="fact",
            conversation_id=row["conversation_id"],
            session_id=row["session_id"],
            speaker=row["speaker"],
            source_role=row["source_role"],
            category=row["category"],
            importance=row["importance"] if row["importance"] is not None else 2,
            event_time=row["event_time"],
            source_ids=list(row["source_ids"] or []),
            user_id=row["user_id"],
            decay_rate=FACT_DECAY_RATE,
        )
        result = writer.replace(row["memory_id"], memory, meta=meta)
    else:
        writer.soft_delete(row["memory_id"], meta=meta)
    _decide(writer, row, status, decided_by, result)
    return result


def _decide(
    writer: MemoryWriter,
    row: dict[str, Any],
    status: str,
    decided_by: str,
    result: str | None = None,
) -> None:
    """Record a decision on the proposal and in `history`."""
    writer.con.execute(
        "UPDATE consent_queue SET status = ?, decided_at = ?, decided_by = ?, result_id = ? "
        "WHERE id = ?",
        [status, writer.now(), decided_by, result, row["id"]],
    )
    event = {
        "accepted": "CONSENT",
        "applied": "CONSENT",
        "rejected": "REJECT",
        "expired": "EXPIRE",
        "stale": "STALE",
    }[status]
    writer.history(
        row["memory_id"],
        event,
        old_ref=row["memory_id"],
        new_ref=result,
        meta={
            "proposal": row["id"],
            "field": row["field"],
            "decision": status,
            "decided_by": decided_by,
            "text": row["proposed_text"],
        },
    )


def _row(con: Any, proposal_id: str) -> dict[str, Any]:
    rows = fetch_dicts(
        con, f"SELECT {_COLUMNS}, session_id, speaker, source_role, category, importance, "
        "event_time, source_ids FROM consent_queue WHERE id = ?",
        [proposal_id],
    )  # fmt: skip
    if not rows:
        raise MemoryOpError(f"no proposal {proposal_id}")
    return rows[0]


def expire_proposals(writer: MemoryWriter, now: datetime) -> int:
    """Pending proposals past their hold: `expired` (history EXPIRE); returns how many."""
    rows = fetch_dicts(
        writer.con,
        f"SELECT {_COLUMNS} FROM consent_queue WHERE status = 'pending' AND expires_at <= ? "
        "ORDER BY id",
        [now],
    )
    for row in rows:
        _decide(writer, row, "expired", "hold elapsed")
    return len(rows)


# --------------------------------------------------------------------------- the caller's API


def list_proposals(
    settings: Settings,
    *,
    scope: Scope | None = None,
    status: str | None = "pending",
    now: datetime | None = None,
) -> list[Proposal]:
    """The proposals the scope may decide (its user's), oldest first; `status` None: all.

    Pending proposals past their hold are listed as `expired` (the nightly job records it).
    """
    scope = scope or Scope()
    now = now or datetime.now(UTC)
    with open_store(settings.db_path, read_only=True) as con:
        scope.check_connection(con)
        rows = fetch_dicts(
            con, f"SELECT {_COLUMNS}, category FROM consent_queue ORDER BY proposed_at, id"
        )
    proposals = []
    for row in rows:
        if not scope.allows({**row, "kind": "fact"}, across_conversations=True):
            continue
        row.pop("category")
        if row["status"] == "pending" and row["expires_at"] <= now:
            row["status"] = "expired"
        if status is None or row["status"] == status:
            proposals.append(Proposal(**row))
    return proposals


def decide(
    settings: Settings,
    proposal_id: str,
    consent: bool,
    *,
    scope: Scope | None = None,
    actor: str = "user",
    now: datetime | None = None,
    refresh: bool = True,
) -> Proposal:
    """Accept (apply) or reject a pending proposal on the user's behalf; returns it decided.

    MemoryOpError for an unknown, decided or expired proposal; AccessDenied outside the scope.
    """
    from memory_dag.memories.agent_ops import refresh_index, scoped_writer

    scope = scope or Scope()
    with scoped_writer(settings, actor, scope, now) as writer:
        row = _row(writer.con, proposal_id)
        scope.check_target({**row, "kind": "fact", "id": proposal_id})
        if row["status"] != "pending":
            raise MemoryOpError(f"proposal {proposal_id} is {row['status']}, not pending")
        if row["expires_at"] <= writer.now():
            _decide(writer, row, "expired", "hold elapsed")
        elif consent:
            apply_proposal(writer, proposal_id, decided_by=actor)
        else:
            _decide(writer, row, "rejected", actor)
        decided = _row(writer.con, proposal_id)
    if decided["status"] == "expired":
        raise MemoryOpError(f"proposal {proposal_id} expired on {row['expires_at']:%Y-%m-%d}")
    if refresh and decided["status"] == "accepted":
        refresh_index(settings)
    return Proposal(**{k: decided[k] for k in Proposal.__dataclass_fields__})


def accept(settings: Settings, proposal_id: str, **options: Any) -> Proposal:
    """Apply a pending proposal (the user's consent)."""
    return decide(settings, proposal_id, True, **options)


def reject(settings: Settings, proposal_id: str, **options: Any) -> Proposal:
    """Drop a pending proposal; the fact stays as it is."""
    return decide(settings, proposal_id, False, **options)
