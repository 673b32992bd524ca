"""`Memory`, the Python API: live writes (durable, searchable at once), reads through one scope,
sessions, and the pipeline folding the journal into the store exactly once."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory_dag import Memory
from memory_dag.index.delta import delta_path
from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.journal import Journal
from memory_dag.memories.writer import MemoryOpError
from memory_dag.pipeline import run_all
from memory_dag.scope import ScopeRequired
from memory_dag.store.connection import open_store

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def memory(tmp_path: Path) -> Memory:
    return Memory(path=tmp_path / "store")


def test_the_mem0_verbs_on_live_writes(memory: Memory) -> None:
    added = memory.add("Sam is allergic to peanuts", user_id="sam", category="profile")
    [event] = added.results
    assert event.event == "ADD" and event.id.startswith("fact_")
    assert json.loads(added.to_json())["results"][0]["id"] == event.id  # pydantic, to JSON
    assert memory.add("Sam is allergic to peanuts", user_id="sam").results[0].event == "NONE"

    found = memory.search("peanut allergy", user_id="sam")
    assert [r.id for r in found.results] == [event.id]
    assert found.to_dict()["results"][0]["memory"] == "Sam is allergic to peanuts"
    item = memory.get(event.id, user_id="sam")
    assert item is not None and (item.user_id, item.category) == ("sam", "profile")
    assert [m.id for m in memory.get_all(user_id="sam").results] == [event.id]

    changed = memory.update(event.id, "Sam is allergic to hazelnuts", user_id="sam")
    assert changed.replaced_id == event.id and changed.id != event.id
    assert [r.id for r in memory.search("allergic", user_id="sam").results] == [changed.id]
    trail = memory.history(changed.id, user_id="sam")
    assert [(e.event, e.pending) for e in trail.events] == [("UPDATE", True)]

    assert memory.delete(changed.id, user_id="sam").status == "forgotten"
    assert memory.search("allergic", user_id="sam").results == []
    assert memory.get_all(user_id="sam").results == []
    with pytest.raises(MemoryOpError, match="not active"):
        memory.delete(changed.id, user_id="sam")
    assert memory.restore(changed.id, user_id="sam").status == "restored"
    assert [r.id for r in memory.search("allergic", user_id="sam").results] == [changed.id]


def test_scope_is_enforced_on_every_verb(memory: Memory) -> None:
    sam = memory.add("Sam's PIN is 1234", user_id="sam", category="profile").results[0].id
    memory.add("Ana likes tea", user_id="ana", category="preferences")
    with pytest.raises(ScopeRequired):  # two users: a read without one fails closed
        memory.search("PIN")
    with pytest.raises(ScopeRequired):
        memory.get_all()
    assert sam not in [r.id for r in memory.search("PIN 1234", user_id="ana", min_score=0).results]
    for call in (
        lambda: memory.get(sam, user_id="ana"),
        lambda: memory.update(sam, "Sam's PIN is 0000", user_id="ana"),
        lambda: memory.delete(sam, user_id="ana"),
        lambda: memory.history(sam, user_id="ana"),
    ):
        with pytest.raises(AccessDenied):
            call()
    with pytest.raises(AccessDenied):  # a filter never widens the scope
        memory.search("PIN", user_id="ana", filters={"user_id": "sam"})
    with pytest.raises(AccessDenied):
        memory.search("PIN", user_id="sam", agent_id="stylist", filters={"category": "profile"})
    assert memory.search("PIN", user_id="sam", agent_id="stylist", min_score=0).results == []
    assert memory.get(sam, user_id="sam") is not None


def test_messages_sessions_and_the_context_block(memory: Memory) -> None:
    said = [{"role": "user", "content": "I started learning the cello."},
            {"role": "assistant", "content": "How exciting!"}]  # fmt: skip
    first = memory.add(said, user_id="sam", conversation_id="chat", now=T0)
    assert len(first.turns) == 2 and first.closed_run_id is None
    assert any("cello" in e.memory for e in first.results if e.event == "ADD")
    same = memory.add([{"role": "user", "content": "It is hard."}], user_id="sam",
                      conversation_id="chat", now=T0 + timedelta(minutes=5))  # fmt: skip
    assert same.run_id == first.run_id
    later = memory.add([{"role": "user", "content": "Back again."}], user_id="sam",
                       conversation_id="chat", now=T0 + timedelta(hours=3))  # fmt: skip
    assert later.run_id != first.run_id and later.closed_run_id == first.run_id

    block = memory.context("what instrument?", conversation_id="chat", user_id="sam")
    assert "cello" in block.text
    current = memory.context("what instrument?", conversation_id="chat", user_id="sam",
                             exclude_run_id=first.run_id)  # fmt: skip
    assert "cello" not in current.text
    answer = memory.query("what instrument does Sam play", agent_id="supervisor",
                          user_id="sam", conversation_id="chat", min_score=0)  # fmt: skip
    assert any("cello" in r.text for r in answer.results)
    with pytest.raises(AccessDenied):
        memory.query("x", agent_id="stylist", user_id="sam", categories=["profile"])
    with pytest.raises(ValueError, match="no user or assistant message"):
        memory.add([{"role": "system", "content": "ignored"}], user_id="sam")


def test_the_pipeline_folds_live_writes_exactly_once(memory: Memory) -> None:
    kept = memory.add("Sam plays chess on Sundays", user_id="sam", category="activity")
    kept_id = kept.results[0].id
    gone = memory.add("Sam owns a red bicycle", user_id="sam", category="profile").results[0].id
    memory.delete(gone, user_id="sam")
    settings = memory.settings
    run_all(settings)
    run_all(settings)  # again: nothing is folded twice
    with open_store(settings.db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT id, state, count(*) OVER (PARTITION BY id) FROM memories WHERE kind = 'fact'"
        ).fetchall()
        adds = con.execute("SELECT count(*) FROM history WHERE event = 'ADD'").fetchone()[0]
    assert sorted(rows) == sorted([(kept_id, "active", 1), (gone, "soft_deleted", 1)])
    assert adds == 2
    trail = memory.history(kept_id, user_id="sam")
    assert [(e.event, e.pending) for e in trail.events] == [("ADD", False)]
    # Searched from the published index now, and still once.
    assert [r.id for r in memory.search("chess", user_id="sam").results] == [kept_id]
    assert gone not in [r.id for r in memory.search("bicycle", user_id="sam", min_score=0).results]


def test_a_torn_journal_line_is_never_applied_and_a_lost_delta_is_rebuilt(
    memory: Memory,
) -> None:
    first = memory.add("Sam grows basil", user_id="sam", category="activity").results[0].id
    journal = Journal(Path(memory.settings.workspace))
    [segment] = journal.segments()
    with open(segment, "ab") as handle:  # a crash in the middle of a batch's line
        handle.write(b'{"seq": 2, "at": "2026-05-01T09:00:00+00:00", "ops": [{"call": "ad')
    assert journal.last_seq() == 1
    delta_path(Path(memory.settings.index_dir)).unlink()  # and the delta segment lost
    second = memory.add("Sam bakes rye bread", user_id="sam", category="activity").results[0].id
    assert journal.last_seq() == 2
    assert all(line.endswith(b"}") for line in segment.read_bytes().splitlines())
    found = {r.id for r in memory.search("basil bread", user_id="sam", min_score=0).results}
    assert {first, second} <= found
    run_all(memory.settings)
    with open_store(memory.settings.db_path, read_only=True) as con:
        facts = con.execute("SELECT id FROM memories WHERE kind = 'fact' ORDER BY id").fetchall()
    assert sorted(f[0] for f in facts) == sorted([first, second])
