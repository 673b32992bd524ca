"""The consent queue (seed 003 §10, issue 13 item 10): changes to sensitive user-context fields
wait for consent for 7 days, benign ones apply when corroborated, every decision in history."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.maintenance.lifecycle import lifecycle
from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.consent import accept, field_of, list_proposals, reject
from memory_dag.memories.write_path import consolidate
from memory_dag.memories.writer import MemoryOpError
from memory_dag.pipeline import run_first_stages as ingest
from memory_dag.scope import Scope
from tests.conftest import write_jsonl
from tests.memories.test_write_path import rows, store_settings

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)


def say(settings: Settings, lines: list[tuple[str, str]], *, at: datetime) -> None:
    """The session so far ((user, text) lines, users alice and bob), then a write-path run."""
    records = [
        {"role": "user", "id": f"t{n}", "name": user.capitalize(), "user_id": user,
         "content": text, "created_at": (at + timedelta(minutes=n)).isoformat()}
        for n, (user, text) in enumerate(lines)
    ]  # fmt: skip
    write_jsonl(settings.workspace / "sessions" / "home" / "s1.jsonl", records)
    ingest(settings)
    consolidate(settings, now=at)


def facts(settings: Settings) -> list[str]:
    return [r["content"] for r in rows(settings, "SELECT content FROM facts ORDER BY content")]


def events(settings: Settings, memory_id: str) -> list[str]:
    found = rows(
        settings, "SELECT event FROM history WHERE memory_id = ? ORDER BY ts, id", [memory_id]
    )
    return [r["event"] for r in found]


@pytest.fixture
def moved(tmp_path: Path) -> tuple[Settings, list[tuple[str, str]], str]:
    """Alice lives in Lisbon, then says she moved to Porto: a change to a sensitive field."""
    settings = store_settings(tmp_path, tmp_path / "ws")
    lines = [("alice", "I live in Lisbon.")]
    say(settings, lines, at=T0)
    [lisbon] = rows(settings, "SELECT id FROM facts")
    lines.append(("alice", "I moved to Porto."))
    say(settings, lines, at=T0 + timedelta(hours=1))
    return settings, lines, lisbon["id"]


def test_fields_are_recognised_in_facts() -> None:
    assert field_of("Sam lives in Lisbon.") == "city"
    assert field_of("Sam moved to Porto in May.") == "city"
    assert field_of("Sam's name is Samuel.") == "preferred_name"
    assert field_of("Sam goes by Sasha.") == "preferred_name"
    assert field_of("Sam's pronouns are they/them.") == "pronouns"
    assert field_of("Sam's preferred language is Portuguese.") == "language"
    assert field_of("Sam prefers short answers.") == "tone"
    assert field_of("Sam's wife is named Anne.") is None  # another person's name
    assert field_of("Sam loves pizza.") is None


def test_a_sensitive_change_waits_for_consent_and_applies_on_accept(moved) -> None:
    settings, _, lisbon = moved
    alice = Scope.of(user_id="alice")

    assert facts(settings) == ["Alice lives in Lisbon."]  # not changed silently
    [pending] = list_proposals(settings, scope=alice, now=T0 + timedelta(hours=2))
    assert (pending.field, pending.sensitivity, pending.action) == ("city", "sensitive", "replace")
    assert (pending.current_text, pending.proposed_text) == (
        "Alice lives in Lisbon.",
        "Alice moved to Porto.",
    )
    assert pending.proposed_at >= T0 + timedelta(hours=1)  # the run's clock
    assert pending.expires_at == pending.proposed_at + timedelta(days=7)
    assert events(settings, lisbon) == ["ADD", "PROPOSE"]

    decided = accept(settings, pending.id, scope=alice, now=T0 + timedelta(days=1))

    assert decided.status == "accepted" and decided.result_id is not None
    assert facts(settings) == ["Alice moved to Porto."]
    [old] = rows(settings, "SELECT state, replaced_by FROM memories WHERE id = ?", [lisbon])
    assert old == {"state": "soft_deleted", "replaced_by": decided.result_id}
    assert events(settings, lisbon) == ["ADD", "PROPOSE", "UPDATE", "CONSENT"]
    consent = rows(
        settings, "SELECT actor, meta FROM history WHERE memory_id = ? AND event = 'CONSENT'",
        [lisbon],
    )[0]  # fmt: skip
    assert consent["actor"] == "user" and json.loads(consent["meta"])["decision"] == "accepted"
    with pytest.raises(MemoryOpError, match="accepted, not pending"):
        reject(settings, pending.id, scope=alice)


def test_a_rejected_change_leaves_the_fact_and_says_so(moved) -> None:
    settings, _, lisbon = moved
    [pending] = list_proposals(settings, scope=Scope.of(user_id="alice"), now=T0)

    decided = reject(
        settings, pending.id, scope=Scope.of(user_id="alice"), now=T0 + timedelta(hours=2)
    )

    assert decided.status == "rejected"
    assert facts(settings) == ["Alice lives in Lisbon."]
    assert events(settings, lisbon)[-1] == "REJECT"
    assert list_proposals(settings, scope=Scope.of(user_id="alice"), now=T0) == []


def test_an_undecided_change_expires_after_seven_days(moved) -> None:
    settings, _, lisbon = moved
    alice = Scope.of(user_id="alice")
    [pending] = list_proposals(settings, scope=alice, now=T0)

    assert lifecycle(settings, T0 + timedelta(days=6)).counts["proposals_expired"] == 0
    report = lifecycle(settings, T0 + timedelta(days=8, hours=2))

    assert report.counts["proposals_expired"] == 1
    assert events(settings, lisbon)[-1] == "EXPIRE"
    assert [p.status for p in list_proposals(settings, scope=alice, status=None)] == ["expired"]
    with pytest.raises(MemoryOpError, match="expired, not pending"):
        accept(settings, pending.id, scope=alice)
    assert facts(settings) == ["Alice lives in Lisbon."]


def test_only_the_user_decides_its_proposals(moved) -> None:
    settings, lines, _ = moved
    say(settings, [*lines, ("bob", "I live in Braga.")], at=T0 + timedelta(hours=2))
    later = T0 + timedelta(hours=3)
    [pending] = list_proposals(settings, scope=Scope.of(user_id="alice"), now=later)

    assert list_proposals(settings, scope=Scope.of(user_id="bob"), now=later) == []
    with pytest.raises(AccessDenied):
        accept(settings, pending.id, scope=Scope.of(user_id="bob"), now=later)
    with pytest.raises(AccessDenied):
        list_proposals(settings, now=later)  # two users in the store: a user is needed


def test_a_benign_change_applies_once_two_turns_said_it(tmp_path: Path) -> None:
    settings = store_settings(tmp_path, tmp_path / "ws")
    lines = [("alice", "I prefer short answers.")]
    say(settings, lines, at=T0)
    lines.append(("alice", "I prefer detailed answers."))
    say(settings, lines, at=T0 + timedelta(hours=1))

    assert facts(settings) == ["Alice prefers short answers."]  # one signal: not yet
    [pending] = list_proposals(settings, scope=Scope.of(user_id="alice"), now=T0)
    assert (pending.sensitivity, pending.signals) == ("benign", 1)

    lines.append(("alice", "Really, I prefer detailed answers."))
    say(settings, lines, at=T0 + timedelta(hours=2))

    assert facts(settings) == ["Alice prefers detailed answers."]
    [applied] = list_proposals(settings, scope=Scope.of(user_id="alice"), status=None, now=T0)
    assert (applied.status, applied.decided_by, applied.signals) == (
        "applied",
        "corroboration",
        2,
    )


def test_cli_consent_list_accept_and_reject(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = store_settings(tmp_path, tmp_path / "ws")
    now = datetime.now(UTC)  # the CLI decides at the wall clock: days away from any expiry
    say(settings, [("alice", "I live in Lisbon.")], at=now - timedelta(minutes=10))
    say(settings, [("alice", "I live in Lisbon."), ("alice", "I moved to Porto.")], at=now)
    where = ["--db", str(settings.db_path), "--index-dir", str(settings.index_dir)]

    assert main(["consent", "list", "--user", "alice", *where, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["proposed_text"] == "Alice moved to Porto."
    assert main(["consent", "list", *where]) == 0  # a store of one user needs no --user
    assert "Alice moved to Porto." in capsys.readouterr().out
    assert main(["consent", "accept", listed["id"], "--user", "alice", *where]) == 0
    out = capsys.readouterr().out
    assert "accepted" in out and listed["id"] in out
    assert main(["consent", "reject", listed["id"], "--user", "alice", *where]) == 1
    assert "not pending" in capsys.readouterr().err


def test_proposals_need_no_llm_and_use_the_scripted_one_alike(
    tmp_path: Path, openai_server: Any
) -> None:
    from tests.memories.test_write_path import llm_settings
    from tests.openai_server import Reply

    def answer(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if messages[0]["role"] == "system":  # extraction: the rules' facts, said by an LLM
            text = messages[-1]["content"]
            return Reply.json(
                ["The user lives in Lisbon."] if "Lisbon" in text else ["The user moved to Porto."]
            )
        prompt = messages[-1]["content"]
        existing = json.loads(prompt.split("Existing memories (JSON):\n")[1].split("\n\n")[0])
        return Reply.json(
            [{"id": m["id"], "text": "Alice moved to Porto.", "event": "UPDATE",
              "old_memory": m["text"]} for m in existing]
        )  # fmt: skip

    openai_server.handler = answer
    settings = store_settings(tmp_path, tmp_path / "ws", **llm_settings(openai_server))
    lines = [("alice", "I live in Lisbon.")]
    say(settings, lines, at=T0)
    say(settings, [*lines, ("alice", "I moved to Porto.")], at=T0 + timedelta(hours=1))

    assert facts(settings) == ["Alice lives in Lisbon."]
    [pending] = list_proposals(settings, scope=Scope.of(user_id="alice"), now=T0)
    assert pending.proposed_text == "Alice moved to Porto."
