"""The write path over real DuckDB files: sessions -> facts -> reconciliation -> history,
entities and relations, with the non-LLM default and with the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memory_dag.config import Settings
from memory_dag.memories.prompts import FACT_SYSTEM_PROMPT
from memory_dag.memories.sessions import scan_sessions, sessions_fingerprint
from memory_dag.memories.write_path import WriteReport, consolidate
from memory_dag.pipeline import run_all
from memory_dag.scope import Scope
from memory_dag.store.connection import fetch_dicts, open_store
from tests.conftest import write_jsonl
from tests.openai_server import Reply, ScriptedOpenAIServer

DEMO = "demo"


def turn(turn_id: str, text: str, when: str, role: str = "user") -> dict[str, Any]:
    name = "Sam" if role == "user" else None
    return {"role": role, "name": name, "id": turn_id, "content": text, "created_at": when}


def pizza_workspace(root: Path) -> Path:
    """Sam loves pizza (session 1), then hates it and names his wife (session 2); session 3 is
    the newer session that closes session 2."""
    sessions = root / "sessions" / DEMO
    write_jsonl(
        sessions / "s1.jsonl",
        [
            turn("a1", "I love pizza!", "2024-01-01T10:00:00Z"),
            turn("a2", "Pizza is a fine choice.", "2024-01-01T10:00:05Z", role="assistant"),
        ],
    )
    write_jsonl(
        sessions / "s2.jsonl",
        [
            turn("b1", "I hate pizza now.", "2024-02-01T10:00:00Z"),
            turn("b2", "My wife is Anne.", "2024-02-01T10:01:00Z"),
        ],
    )
    write_jsonl(sessions / "s3.jsonl", [turn("c1", "Hi again.", "2024-03-01T10:00:00Z")])
    return root


def store_settings(tmp_path: Path, workspace: Path, **llm: Any) -> Settings:
    return Settings(
        workspace=workspace,
        db_path=tmp_path / "store" / "memory.duckdb",
        index_dir=tmp_path / "store" / "index",
        **llm,
    )


def rows(settings: Settings, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    with open_store(settings.db_path, read_only=True) as con:
        return fetch_dicts(con, sql, params)


def table_counts(settings: Settings) -> dict[str, int]:
    tables = [
        "memories",
        "history",
        "change_log",
        "entities",
        "memory_entities",
        "relations",
        "events",
        "embedding_cache",
    ]
    with open_store(settings.db_path, read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


def facts_report(reports: list[Any]) -> WriteReport:
    return next(r for r in reports if isinstance(r, WriteReport))


# --------------------------------------------------------------------------- scripted LLM

EXTRACTIONS = {
    "I love pizza!": ["The user loves pizza."],
    "I hate pizza now.": ["The user hates pizza."],
    "My wife is Anne.": ["The user's wife is named Anne."],
}
#: new fact -> existing memory it contradicts
CONTRADICTIONS = {"Sam hates pizza.": "Sam loves pizza."}


def _between(text: str, start: str, end: str) -> Any:
    return json.loads(text.split(start, 1)[1].split(end, 1)[0])


def scripted_llm(body: dict[str, Any]) -> Reply:
    """Answers like a well-behaved model: facts by message, reconciliation by contradiction."""
    messages = body["messages"]
    if messages[0]["content"] == FACT_SYSTEM_PROMPT:
        return Reply.json(EXTRACTIONS.get(messages[-1]["content"], []))
    prompt = messages[-1]["content"]
    if "Existing memories (JSON):" not in prompt:  # the summaries stage of the same run
        return Reply.text("Sam talked about pizza.")
    existing = _between(prompt, "Existing memories (JSON):\n", "\n\nNew facts (JSON):")
    new_facts = _between(prompt, "New facts (JSON):\n", "\n\nAnswer with")
    contradicted = {CONTRADICTIONS.get(fact) for fact in new_facts}
    answer = [
        {
            "id": m["id"],
            "text": m["text"],
            "event": "DELETE" if m["text"] in contradicted else "NONE",
        }
        for m in existing
    ]
    answer += [
        {"id": str(len(existing) + i), "text": fact, "event": "ADD"}
        for i, fact in enumerate(new_facts)
    ]
    return Reply.json(answer)


def llm_settings(server: ScriptedOpenAIServer) -> dict[str, Any]:
    return {"llm_base_url": server.base_url, "llm_model": "scripted-model"}


# --------------------------------------------------------------------------- done means


@pytest.mark.parametrize(
    ("method", "hates"), [("rules", "Sam now hates pizza."), ("llm", "Sam hates pizza.")]
)
def test_pizza_conversation_keeps_the_latest_truth_and_its_history(
    tmp_path: Path, openai_server: ScriptedOpenAIServer, method: str, hates: str
) -> None:
    openai_server.handler = scripted_llm
    llm = llm_settings(openai_server) if method == "llm" else {}
    settings = store_settings(tmp_path, pizza_workspace(tmp_path / "ws"), **llm)

    report = facts_report(run_all(settings))

    assert report.method == method
    assert report.counts["sessions_consolidated"] == 2  # s3 is the open, newest session
    assert report.counts["sessions_observed"] == 1  # its turns are examined as they arrive
    assert report.counts["turns_examined"] == 4  # user turns only
    active = rows(settings, "SELECT * FROM facts ORDER BY event_time")
    assert [f["content"] for f in active] == [hates, "Sam's wife is named Anne."]
    episodes = {
        e["turn_id"]: e
        for e in rows(settings, "SELECT * FROM episodes WHERE conversation_id = ?", [DEMO])
    }
    hate_fact, wife_fact = active
    assert hate_fact["source_ids"] == [episodes["b1"]["id"]]
    assert hate_fact["event_time"] == episodes["b1"]["event_time"]
    assert (hate_fact["session_id"], hate_fact["speaker"], hate_fact["source_role"]) == (
        "s2",
        "Sam",
        "user",
    )
    assert (hate_fact["category"], hate_fact["decay_rate"]) == ("preferences", 0.1)
    assert wife_fact["category"] == "relationships"

    [loved] = rows(settings, "SELECT * FROM memories WHERE kind = 'fact' AND state <> 'active'")
    assert loved["content"] == "Sam loves pizza."
    assert loved["state"] == "soft_deleted" and loved["valid_until"] is not None
    assert loved["source_ids"] == [episodes["a1"]["id"]]
    history = rows(
        settings,
        "SELECT event, old_ref, new_ref, actor FROM history WHERE memory_id = ? ORDER BY ts",
        [loved["id"]],
    )
    assert history == [
        {"event": "ADD", "old_ref": None, "new_ref": loved["id"], "actor": "write_path"},
        {
            "event": "DELETE",
            "old_ref": loved["id"],
            "new_ref": hate_fact["id"],
            "actor": "write_path",
        },
    ]
    changes = rows(
        settings,
        "SELECT rev, event, memory_id FROM change_log WHERE conversation_id = ? ORDER BY rev",
        [DEMO],
    )
    assert [(c["rev"], c["event"]) for c in changes] == [
        (1, "created"),
        (2, "deleted"),
        (3, "created"),
        (4, "created"),
    ]
    assert rows(settings, "SELECT rev FROM conversation_revisions")[0]["rev"] == 4

    [anne] = rows(settings, "SELECT * FROM entities WHERE canonical_name = 'Anne'")
    assert anne["type"] == "person"
    linked = {
        r["memory_id"]
        for r in rows(
            settings, "SELECT memory_id FROM memory_entities WHERE entity_id = ?", [anne["id"]]
        )
    }
    assert linked == {wife_fact["id"], episodes["b2"]["id"]}
    assert anne["mention_count"] == 2
    [sam] = rows(settings, "SELECT * FROM entities WHERE canonical_name = 'Sam'")
    about_sam = rows(
        settings, "SELECT memory_id FROM memory_entities WHERE entity_id = ?", [sam["id"]]
    )
    assert sam["type"] == "person"  # the speaker of the facts
    assert {r["memory_id"] for r in about_sam} == {loved["id"], hate_fact["id"], wife_fact["id"]}

    # The same input again: the pipeline finds nothing due and runs its files stage alone; the
    # write path itself, run anyway, adds nothing and asks nothing.
    before, asked = table_counts(settings), len(openai_server.chat_requests)
    assert [report.stage for report in run_all(settings)] == ["files"]
    again = consolidate(settings)
    assert table_counts(settings) == before
    assert len(openai_server.chat_requests) == asked
    assert again.counts["turns_examined"] == again.counts["facts_added"] == 0


@pytest.mark.parametrize("method", ["rules", "llm"])
def test_turns_of_the_open_session_become_facts_as_they_arrive(
    tmp_path: Path, openai_server: ScriptedOpenAIServer, method: str
) -> None:
    """Issue 13 item 4 (seed 000 §4: extraction after each turn): the live session's user
    turns are examined once as they arrive; closing the session re-checks only what is left."""
    model_down_for_anne = {"on": True}

    def anne_fails_while_the_model_is_down(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["content"] == "My wife is Anne." and model_down_for_anne["on"]:
            return Reply.status(500)
        return scripted_llm(body)

    openai_server.handler = anne_fails_while_the_model_is_down
    llm = llm_settings(openai_server) if method == "llm" else {}
    sessions = tmp_path / "ws" / "sessions" / DEMO
    settings = store_settings(tmp_path, tmp_path / "ws", **llm)
    hates = "Sam now hates pizza." if method == "rules" else "Sam hates pizza."

    write_jsonl(sessions / "s1.jsonl", [turn("a1", "I love pizza!", "2024-01-01T10:00:00Z")])
    first = facts_report(run_all(settings))
    assert (first.counts["sessions_consolidated"], first.counts["sessions_observed"]) == (0, 1)
    assert first.counts["turns_examined"] == 1
    assert [f["content"] for f in rows(settings, "SELECT content FROM facts")] == [
        "Sam loves pizza."
    ]

    write_jsonl(
        sessions / "s1.jsonl",
        [
            turn("a1", "I love pizza!", "2024-01-01T10:00:00Z"),
            turn("a2", "I hate pizza now.", "2024-01-01T10:05:00Z"),
            turn("a3", "My wife is Anne.", "2024-01-01T10:06:00Z"),
        ],
    )
    second = facts_report(run_all(settings))
    assert second.counts["turns_examined"] == 2  # the new turns only, each once
    assert [f["content"] for f in rows(settings, "SELECT content FROM facts")] == (
        [hates] if method == "llm" else [hates, "Sam's wife is named Anne."]
    )
    [open_session] = rows(settings, "SELECT * FROM sessions_consolidations")
    assert open_session["consolidated_at"] is None

    model_down_for_anne["on"] = False
    write_jsonl(sessions / "s2.jsonl", [turn("b1", "Hi again.", "2024-02-01T10:00:00Z")])
    third = facts_report(run_all(settings))
    assert third.counts["sessions_consolidated"] == 1
    # The close re-checks what the live path could not do: the failed extraction, once.
    assert third.counts["turns_examined"] == (2 if method == "llm" else 1)
    active = [f["content"] for f in rows(settings, "SELECT content FROM facts ORDER BY content")]
    assert active == sorted([hates, "Sam's wife is named Anne."])
    closed = rows(settings, "SELECT * FROM sessions_consolidations WHERE session_id = 's1'")
    assert closed[0]["consolidated_at"] is not None and closed[0]["facts_written"] == 3
    assert [report.stage for report in run_all(settings)] == ["files"]  # nothing due
    assert consolidate(settings).counts["turns_examined"] == 0  # nor for the write path itself


def test_facts_that_break_the_writing_rules_are_rejected_and_counted(
    tmp_path: Path, openai_server: ScriptedOpenAIServer
) -> None:
    """Issue 13 item 6: the same validator for rules and LLM output; rejections are counted."""
    text = "Honestly I hate pizza now, I don't want to see one for a long time."
    workspace = tmp_path / "ws"
    write_jsonl(
        workspace / "sessions" / DEMO / "s1.jsonl", [turn("a1", text, "2024-01-01T10:00:00Z")]
    )
    rules = facts_report(run_all(store_settings(tmp_path / "rules", workspace)))
    assert rules.counts["facts_rejected"] == 1 and rules.counts["facts_added"] == 1

    openai_server.handler = lambda body: (
        Reply.json(["He likes it a lot.", "The user hates pizza."])
        if body["messages"][0]["content"] == FACT_SYSTEM_PROMPT
        else scripted_llm(body)
    )
    settings = store_settings(tmp_path / "llm", workspace, **llm_settings(openai_server))
    report = facts_report(run_all(settings))
    assert report.counts["facts_rejected"] == 1
    assert [f["content"] for f in rows(settings, "SELECT content FROM facts")] == [
        "Sam hates pizza."
    ]


def test_two_users_in_one_conversation_never_reconcile_against_each_other(
    tmp_path: Path,
) -> None:
    """Reconciliation neighbours are the same owner's facts: "The user hates sushi" from bob
    does not delete alice's "The user loves sushi" (without user ids it would: one owner)."""
    lines = [
        {"role": "user", "id": "a1", "user_id": "alice", "content": "I love sushi."},
        {"role": "user", "id": "b1", "user_id": "bob", "content": "I hate sushi."},
    ]
    owned = tmp_path / "owned"
    write_jsonl(owned / "ws" / "sessions" / "team" / "s1.jsonl", lines)
    settings = store_settings(owned, owned / "ws")
    run_all(settings)
    facts = rows(settings, "SELECT content, user_id FROM facts ORDER BY user_id")
    assert facts == [
        {"content": "The user loves sushi.", "user_id": "alice"},
        {"content": "The user hates sushi.", "user_id": "bob"},
    ]

    shared = tmp_path / "shared"
    write_jsonl(
        shared / "ws" / "sessions" / "team" / "s1.jsonl",
        [{k: v for k, v in line.items() if k != "user_id"} for line in lines],
    )
    settings = store_settings(shared, shared / "ws")
    run_all(settings)
    assert [f["content"] for f in rows(settings, "SELECT content FROM facts")] == [
        "The user hates sushi."
    ]


def test_llm_failures_fall_back_as_the_seed_says_and_are_recorded(
    tmp_path: Path, openai_server: ScriptedOpenAIServer
) -> None:
    """Extraction failure -> no facts for that turn; reconciliation failure -> add all."""

    def flaky(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if messages[0]["content"] == FACT_SYSTEM_PROMPT:
            if messages[-1]["content"] == "I have two cats.":
                return Reply.json({"facts": ["The user has two cats."]})  # breaks the schema
            return scripted_llm(body)
        return Reply.text("Sure! Here is what I think.")  # not JSON

    openai_server.handler = flaky
    workspace = pizza_workspace(tmp_path / "ws")
    write_jsonl(
        workspace / "sessions" / DEMO / "s1.jsonl",
        [
            turn("a1", "I love pizza!", "2024-01-01T10:00:00Z"),
            turn("a3", "I have two cats.", "2024-01-01T10:02:00Z"),
        ],
    )
    settings = store_settings(tmp_path, workspace, **llm_settings(openai_server))

    report = facts_report(run_all(settings))

    contents = {f["content"] for f in rows(settings, "SELECT content FROM facts")}
    assert contents == {"Sam loves pizza.", "Sam hates pizza.", "Sam's wife is named Anne."}
    assert not any("cats" in text for text in contents)
    events = rows(
        settings,
        "SELECT node, op, status, memory_id, meta FROM events WHERE status = 'error' ORDER BY ts",
    )
    assert [(e["node"], e["op"]) for e in events] == [
        ("facts", "extract"),
        ("reconcile", "reconcile"),
        ("reconcile", "reconcile"),
    ]
    assert json.loads(events[0]["meta"])["kind"] == "schema"
    assert json.loads(events[1]["meta"])["kind"] == "malformed"
    assert report.counts["llm_failures"] == 3
    assert any("3 LLM failures" in note for note in report.notes)


def test_a_newer_session_closes_the_older_one_and_an_edited_transcript_is_reopened(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    sessions = workspace / "sessions" / DEMO
    write_jsonl(sessions / "s1.jsonl", [turn("a1", "I love pizza!", "2024-01-01T10:00:00Z")])
    settings = store_settings(tmp_path, workspace)

    first = facts_report(run_all(settings))
    assert first.counts["sessions_registered"] == 1
    assert first.counts["sessions_consolidated"] == 0  # the only session is still open...
    [loves] = rows(settings, "SELECT id, content FROM facts")  # ...but its turns are facts
    assert loves["content"] == "Sam loves pizza."

    write_jsonl(sessions / "s2.jsonl", [turn("b1", "My wife is Anne.", "2024-02-01T10:00:00Z")])
    second = facts_report(run_all(settings))
    assert second.counts["sessions_consolidated"] == 1
    assert second.counts["turns_examined"] == 1  # b1; a1 was examined when it arrived
    registered = rows(settings, "SELECT * FROM sessions_consolidations ORDER BY path")
    assert registered[0]["first_seen_at"] < registered[1]["first_seen_at"]
    assert registered[0]["consolidated_at"] is not None and registered[0]["facts_written"] == 1
    assert registered[1]["consolidated_at"] is None and registered[1]["facts_written"] == 1

    # s1 was consolidated; its transcript now grows a turn: only that turn is examined.
    write_jsonl(
        sessions / "s1.jsonl",
        [
            turn("a1", "I love pizza!", "2024-01-01T10:00:00Z"),
            turn("a2", "I live in Paris.", "2024-01-01T10:05:00Z"),
        ],
    )
    third = facts_report(run_all(settings))
    assert third.counts["sessions_reopened"] == 1
    assert third.counts["turns_examined"] == 1
    facts = {f["content"]: f["id"] for f in rows(settings, "SELECT id, content FROM facts")}
    assert set(facts) == {"Sam loves pizza.", "Sam lives in Paris.", "Sam's wife is named Anne."}
    assert facts["Sam loves pizza."] == loves["id"]  # untouched: its turn was not examined again
    reopened = rows(settings, "SELECT detail FROM events WHERE op = 'reopen'")
    assert len(reopened) == 1 and "sessions/demo/s1.jsonl" in reopened[0]["detail"]

    before = table_counts(settings)
    assert [report.stage for report in run_all(settings)] == ["files"]  # nothing due
    assert consolidate(settings).counts["turns_examined"] == 0  # nor for the write path itself
    assert table_counts(settings) == before


def test_related_facts_are_linked_within_their_conversation(tmp_path: Path) -> None:
    from memory_dag.embed.providers import get_provider
    from memory_dag.memories.agent_ops import remember
    from memory_dag.memories.relations import LINK_MIN

    settings = store_settings(tmp_path, tmp_path / "ws")
    texts = [
        "Sam loves hiking in the Alps.",
        "Sam loves hiking in the mountains.",
        "Sam's wife is named Anne.",
        "Sam enjoys long hikes in the Alps.",
    ]
    ids = [
        remember(settings, t, scope=Scope.of(conversation_id="a"), refresh=False).memory_id
        for t in texts
    ]
    remember(
        settings, texts[0], scope=Scope.of(conversation_id="b"), refresh=False
    )  # same text, other people

    edges = rows(settings, "SELECT from_id, to_id, relation_type, strength FROM relations")
    vectors = get_provider(settings).embed(texts)
    expected = {
        (ids[i], ids[j])
        for i in range(len(texts))
        for j in range(i)
        if float(vectors[i] @ vectors[j]) >= LINK_MIN
    }
    assert expected == {(ids[1], ids[0]), (ids[3], ids[0])}  # the hiking facts, not Anne
    assert {(e["from_id"], e["to_id"]) for e in edges} == expected
    for edge in edges:
        i, j = ids.index(edge["from_id"]), ids.index(edge["to_id"])
        assert edge["strength"] == pytest.approx(float(vectors[i] @ vectors[j]), abs=1e-3)
        assert edge["relation_type"] == "related_to"


# --------------------------------------------------------------------------- sensor's scan


def test_scan_sessions_asks_for_a_run_only_when_a_session_closes(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions" / DEMO
    write_jsonl(sessions / "s1.jsonl", [turn("a1", "I love pizza!", "2024-01-01T10:00:00Z")])
    later = time.time() + 60  # every file is older than the debounce

    changes, state = scan_sessions(tmp_path, {}, now=later)
    assert changes.new == ["sessions/demo/s1.jsonl"] and changes.conversations == [DEMO]

    unchanged, same = scan_sessions(tmp_path, state, now=later)
    assert unchanged.conversations == [] and same == state

    write_jsonl(sessions / "s1.jsonl", [turn("a1", "I love pasta!", "2024-01-01T10:00:00Z")])
    live, state = scan_sessions(tmp_path, state, now=later + 60)
    assert live.changed == ["sessions/demo/s1.jsonl"]
    assert live.conversations == []  # the live session changes all the time

    write_jsonl(sessions / "s2.jsonl", [turn("b1", "Hi again.", "2024-02-01T10:00:00Z")])
    started, state = scan_sessions(tmp_path, state, now=later + 120)
    assert started.conversations == [DEMO]

    write_jsonl(sessions / "s1.jsonl", [turn("a1", "I love risotto!", "2024-01-01T10:00:00Z")])
    edited, state = scan_sessions(tmp_path, state, now=later + 180)
    assert edited.conversations == [DEMO]  # a closed session was edited
    assert sessions_fingerprint(state, [DEMO]) != sessions_fingerprint(
        {**state, "sessions/demo/s1.jsonl": [0, 0, "other", 1]}, [DEMO]
    )

    fresh = tmp_path / "sessions" / "other" / "x.jsonl"
    write_jsonl(fresh, [turn("x1", "Hello.", "2024-02-01T10:00:00Z")])
    settling, waited = scan_sessions(tmp_path, state, now=fresh.stat().st_mtime + 0.5)
    assert "sessions/other/x.jsonl" in settling.settling and settling.conversations == []
    settled, _ = scan_sessions(tmp_path, waited, now=fresh.stat().st_mtime + 60)
    assert settled.new == ["sessions/other/x.jsonl"] and settled.conversations == ["other"]


def test_extractions_are_taken_as_far_as_the_turn_asked_for() -> None:
    """The write path reconciles a turn as soon as its candidates arrive: asking for one turn
    takes the results up to it, no further, and a turn never asked about is not waited for."""
    from memory_dag.memories.facts import FactCandidate
    from memory_dag.memories.write_path import ArrivingExtractions, Extracted, UserTurn

    turns = [
        UserTurn(f"ep{n}", f"t{n}", "s.jsonl", DEMO, "s", "Sam", "user", f"I like tea {n}.", None)
        for n in range(5)
    ]
    taken: list[int] = []

    def results() -> Iterator[Extracted]:
        for n in range(5):
            taken.append(n)
            yield [FactCandidate(f"Sam likes tea {n}", f"t{n}", "Sam", None, 2)], None, []

    arriving = ArrivingExtractions(turns, results())
    assert len(arriving) == 5 and taken == []
    assert arriving[turns[2].key][0][0].text == "Sam likes tea 2"
    assert taken == [0, 1, 2]
    assert arriving[turns[0].key][0][0].text == "Sam likes tea 0"  # kept, not taken again
    assert taken == [0, 1, 2]
    with pytest.raises(KeyError):
        arriving["ep9:unknown"]
    assert taken == [0, 1, 2, 3, 4]
    assert list(arriving) == [turn.key for turn in turns]
