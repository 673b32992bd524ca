"""The agent-facing operations over a real DuckDB store and the published search index."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.index.search import search
from memory_dag.ingest.files import sync_files
from memory_dag.memories.agent_ops import (
    FORGET_PURGE_DAYS,
    confirm,
    correct,
    forget,
    remember,
    restore,
)
from memory_dag.memories.change_log import changes
from memory_dag.memories.fold import fold_journal
from memory_dag.memories.lookups import entity_profile, memory_history, stats
from memory_dag.memories.writer import MemoryOpError
from memory_dag.scope import Scope
from memory_dag.store.connection import open_store
from tests.conftest import write_jsonl
from tests.memories.test_write_path import rows, store_settings


@pytest.fixture
def store(tmp_path: Path) -> Settings:
    return store_settings(tmp_path, tmp_path / "ws")


def fact_ids(settings: Settings, query: str) -> list[str]:
    return [hit.id for hit in search(query, settings=settings, kind="fact", min_score=0.0)]


def test_remember_is_searchable_at_once_and_never_stored_twice(store: Settings) -> None:
    result = remember(
        store, "Sam loves pizza.", scope=Scope.of(conversation_id="demo"), speaker="Sam"
    )

    assert (result.status, result.revision, result.index_rows) == ("created", 1, 1)
    assert fact_ids(store, "pizza") == [result.memory_id]
    [row] = rows(store, "SELECT * FROM facts")
    assert (row["source_role"], row["category"], row["importance"]) == ("agent", "preferences", 3)
    assert (row["decay_rate"], row["conversation_id"], row["speaker"]) == (0.1, "demo", "Sam")
    [added] = rows(store, "SELECT event, actor FROM history WHERE memory_id = ?", [row["id"]])
    assert added == {"event": "ADD", "actor": "agent"}
    linked = rows(
        store,
        "SELECT e.canonical_name FROM memory_entities l JOIN entities e ON e.id = l.entity_id "
        "WHERE l.memory_id = ?",
        [row["id"]],
    )
    assert linked == [{"canonical_name": "Sam"}]

    again = remember(store, "sam LOVES pizza", scope=Scope.of(conversation_id="demo"))
    assert (again.status, again.memory_id) == ("duplicate", result.memory_id)
    elsewhere = remember(
        store, "Sam loves pizza.", scope=Scope.of(conversation_id="other"), refresh=False
    )
    assert elsewhere.status == "created"  # another conversation is about other people
    assert len(rows(store, "SELECT id FROM facts")) == 2

    for bad in ("   ", "x" * 281, "One thing. Another thing. A third thing."):
        with pytest.raises(MemoryOpError):
            remember(store, bad)


def test_correct_forget_restore_and_confirm_leave_a_trail(store: Settings) -> None:
    paris = remember(
        store, "Sam lives in Paris.", scope=Scope.of(conversation_id="demo"), speaker="Sam"
    ).memory_id
    updated = correct(store, paris, "Sam lives in Berlin.")

    assert (updated.status, updated.replaced_id) == ("updated", paris)
    berlin = updated.memory_id
    old, new = (rows(store, "SELECT * FROM memories WHERE id = ?", [i])[0] for i in (paris, berlin))
    assert (old["state"], old["replaced_by"]) == ("soft_deleted", berlin)
    assert old["valid_until"] is not None and old["purge_at"] is None
    assert (new["supersedes"], new["conversation_id"], new["speaker"]) == (paris, "demo", "Sam")
    assert fact_ids(store, "Where does Sam live?") == [berlin]
    events = memory_history(store, paris)["history"]
    assert [(e["event"], e["old_ref"], e["new_ref"]) for e in events] == [
        ("ADD", None, paris),
        ("UPDATE", paris, berlin),
    ]
    assert events[1]["meta"]["old_text"] == "Sam lives in Paris."
    with pytest.raises(MemoryOpError, match="replaced by"):
        restore(store, paris)  # two versions of where Sam lives would both be served

    forgotten = forget(store, berlin)
    assert forgotten.status == "forgotten"
    [row] = rows(store, "SELECT state, purge_at FROM memories WHERE id = ?", [berlin])
    expected_purge = datetime.now(UTC) + timedelta(days=FORGET_PURGE_DAYS)
    assert row["state"] == "soft_deleted"
    assert abs(row["purge_at"] - expected_purge) < timedelta(minutes=5)
    assert fact_ids(store, "Where does Sam live?") == []
    with pytest.raises(MemoryOpError, match="not active"):
        forget(store, berlin)

    restore(store, berlin)
    [row] = rows(store, "SELECT state, valid_until, purge_at FROM memories WHERE id = ?", [berlin])
    assert row == {"state": "active", "valid_until": None, "purge_at": None}
    assert fact_ids(store, "Where does Sam live?") == [berlin]

    confirm(store, berlin)
    [row] = rows(store, "SELECT decay_rate, confidence FROM memories WHERE id = ?", [berlin])
    assert row == {"decay_rate": 0.0, "confidence": 1.0}
    trail = [e["event"] for e in memory_history(store, berlin)["history"]]
    assert trail == ["UPDATE", "DELETE", "RESTORE", "CONFIRM"]
    revisions = rows(store, "SELECT event FROM change_log ORDER BY rev")
    assert [r["event"] for r in revisions] == [
        "created",
        "updated",
        "soft_deleted",
        "restored",
        "confirmed",
    ]
    with pytest.raises(MemoryOpError, match="no memory"):
        confirm(store, "fact_missing")


def test_episodes_mirror_transcripts_and_cannot_be_forgotten(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    write_jsonl(workspace / "sessions" / "demo" / "s1.jsonl", [{"role": "user", "content": "Hi"}])
    settings = store_settings(tmp_path, workspace)
    sync_files(settings)
    [episode] = rows(settings, "SELECT id FROM episodes")
    with pytest.raises(MemoryOpError, match="transcript"):
        forget(settings, episode["id"])
    with pytest.raises(MemoryOpError, match="transcript"):
        correct(settings, episode["id"], "Something else.")


def test_changes_give_the_delta_header_with_at_most_three_bullets(store: Settings) -> None:
    pizza = remember(
        store, "Sam loves pizza.", scope=Scope.of(conversation_id="demo"), refresh=False
    ).memory_id
    remember(
        store, "Sam's wife is named Anne.", scope=Scope.of(conversation_id="demo"), refresh=False
    )
    forget(store, pizza, refresh=False)
    remember(store, "Lee plays chess.", scope=Scope.of(conversation_id="other"), refresh=False)

    delta = changes(store, 0, "demo")
    assert delta.revisions == {"demo": 3}
    assert [(c["rev"], c["event"]) for c in delta.changes] == [
        (1, "created"),
        (2, "created"),
        (3, "soft_deleted"),
    ]
    assert delta.header.splitlines() == [
        "Memory updates since rev 0:",
        "- −soft_deleted: [preferences] Sam loves pizza",  # the latest change of each memory
        "- +created: [relationships] Sam's wife is named Anne (imp=4)",
    ]
    assert changes(store, 2, "demo").header.splitlines()[1:] == [
        "- −soft_deleted: [preferences] Sam loves pizza"
    ]
    assert changes(store, 3, "demo").header == "" and changes(store, 3, "demo").changes == []

    for text in ("Sam plays the cello.", "Sam moved to Lisbon.", "Sam is learning Portuguese."):
        remember(store, text, scope=Scope.of(conversation_id="demo"), refresh=False)
    header = changes(store, 3, "demo").header.splitlines()
    assert len(header) == 4  # the title and three bullets, newest first
    assert header[1] == "- +created: [activity] Sam is learning Portuguese (imp=2)"
    everywhere = changes(store, 0)
    assert {c["conversation_id"] for c in everywhere.changes} == {"demo", "other"}
    assert everywhere.revisions == {"demo": 6, "other": 1}


def test_a_corrected_fact_never_reads_as_created_in_the_delta_header(store: Settings) -> None:
    """Issue 13 item 5: after a correction only the net state shows."""
    demo = Scope.of(conversation_id="demo")
    peanuts = remember(store, "Sam is allergic to peanuts.", scope=demo, refresh=False)
    remember(store, "Sam's wife is named Anne.", scope=demo, refresh=False)
    seen = changes(store, 0, "demo").revisions["demo"]
    correct(store, peanuts.memory_id, "Sam is allergic to hazelnuts.", refresh=False)

    fresh = changes(store, 0, "demo").header.splitlines()
    assert not [line for line in fresh if "peanuts" in line]
    # A reader who never saw the peanuts fact learns of one new fact: hazelnuts.
    assert "- +created: [profile] Sam is allergic to hazelnuts (imp=5)" in fresh
    since_seen = changes(store, seen, "demo").header.splitlines()
    assert since_seen[1:] == ["- ↑updated: [profile] Sam is allergic to hazelnuts"]


def test_stats_and_entity_profiles(store: Settings) -> None:
    first = remember(
        store, "Anne called Sam yesterday.", scope=Scope.of(conversation_id="demo"), refresh=False
    )
    wife = remember(
        store, "Sam's wife is named Anne.", scope=Scope.of(conversation_id="demo"), refresh=False
    )
    remember(store, "Jon loves jazz.", scope=Scope.of(conversation_id="demo"), refresh=False)
    gone = remember(
        store,
        "Sam is working on Jon's business.",
        scope=Scope.of(conversation_id="demo"),
        refresh=False,
    )
    forget(store, gone.memory_id, refresh=False)

    summary = stats(store)
    assert summary["kinds"]["fact"]["active"] == 3
    assert summary["kinds"]["fact"]["soft_deleted"] == 1
    assert summary["latest"]["id"] == gone.memory_id

    [anne] = entity_profile(store, "ANNE")
    # First seen as a bare name, then named by a strong cue ("wife ... Anne"): a person.
    assert (anne["canonical_name"], anne["type"], anne["mention_count"]) == ("Anne", "person", 2)
    assert [m["id"] for m in anne["memories"]] == [wife.memory_id, first.memory_id]
    assert anne["memory_counts"] == {"fact": 2}
    [jon] = entity_profile(store, "jon")
    assert jon["type"] == "other"  # "working on Jon's business" is too weak a cue for a project
    assert jon["memory_counts"] == {"fact": 1}  # the forgotten fact is not shown
    assert entity_profile(store, "Nobody") == []


def test_cli_commands_run_the_same_operations(
    store: Settings, capsys: pytest.CaptureFixture
) -> None:
    where = ["--db", str(store.db_path), "--index-dir", str(store.index_dir)]
    where += ["--workspace", str(store.workspace)]  # live writes journal there
    with open_store(store.db_path):  # the CLI works on an existing store (`ingest` makes one)
        pass

    assert main(["remember", "Sam loves pizza.", "--conversation", "demo", *where, "--json"]) == 0
    [created] = json.loads(capsys.readouterr().out)["results"]
    assert created["event"] == "ADD" and created["memory"] == "Sam loves pizza."

    # A live write: in the delta header and the history before any pipeline run...
    assert main(["changes", "--since", "0", "--conversation", "demo", *where]) == 0
    assert "- +created: [preferences] Sam loves pizza (imp=3)" in capsys.readouterr().out
    assert main(["history", created["id"], *where]) == 0
    assert "ADD" in capsys.readouterr().out

    # ...and linked to its entities once the pipeline folded it into the store.
    fold_journal(store)
    assert main(["history", created["id"], *where]) == 0
    assert "not folded yet" not in capsys.readouterr().out
    assert main(["entity", "sam", *where, "--json"]) == 0
    [profile] = json.loads(capsys.readouterr().out)
    assert profile["memories"][0]["id"] == created["id"]

    assert main(["forget", "fact_missing", *where]) == 1
    assert "no memory fact_missing" in capsys.readouterr().err
