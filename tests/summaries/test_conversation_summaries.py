"""Conversation summaries in a real store: input, every level's tree, rolling replacement,
failures, and the CLI. Conversations are real transcripts ingested by `sync_files`."""

from __future__ import annotations

import json
import math
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.index.search import search
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.ingest.tokens import count_tokens
from memory_dag.llm import LLMClient, LLMConfig
from memory_dag.store.connection import fetch_dicts, open_store
from memory_dag.summaries.conversation_summaries import (
    CONTENT_TYPE,
    FACTS_HEADER,
    ConversationInput,
    final_summary,
    gather_input,
    summary_tree,
)
from memory_dag.summaries.refresh import summarize_conversation
from memory_dag.summaries.summarizer import (
    SummarizationError,
    SummarizerConfig,
    SummaryLevel,
    chunk_text,
    determine_level,
    summarize,
)
from tests.conftest import write_jsonl
from tests.openai_server import Reply, ScriptedOpenAIServer
from tests.summaries.test_summarizer import by_prompt, sentence

SPEAKERS = ("Dana", "Ravi")
START = datetime(2025, 3, 1, 18, 30, tzinfo=UTC)
#: Rendered-input sizes inside each level's band (NONE < 100 ≤ BRIEF < 500 ≤ STANDARD < 3000 ≤
#: DETAILED < 15000 ≤ HIERARCHICAL).
LEVEL_TOKENS = {
    SummaryLevel.BRIEF: 300,
    SummaryLevel.STANDARD: 1500,
    SummaryLevel.DETAILED: 8000,
    SummaryLevel.HIERARCHICAL: 17000,
}


# --- Helpers (also used by test_export.py and dagster_layer/test_summary_assets.py) ---------


def settings_in(root: Path) -> Settings:
    return Settings(
        workspace=root / "workspace",
        db_path=root / "store" / "memory.duckdb",
        index_dir=root / "store" / "index",
    )


def write_conversation(
    workspace: Path, conversation_id: str, tokens: int, *, seed: int = 0, first_session: int = 1
) -> list[Path]:
    """Sessions of up to 20 turns (3 sentences each), a day apart, until ~`tokens` tokens."""
    rng = random.Random(seed)
    paths: list[Path] = []
    estimate = 0
    number = first_session
    while estimate < tokens:
        when = START + timedelta(days=number)
        records: list[dict | str] = []
        for index in range(20):
            text = " ".join(sentence(rng) for _ in range(3))
            speaker = SPEAKERS[index % 2]
            records.append(
                {
                    "role": "user",
                    "name": speaker,
                    "id": f"s{number}:{index}",
                    "content": text,
                    "created_at": when.isoformat(),
                }
            )
            estimate += count_tokens(f"{speaker}: {text}") + 1
            if estimate >= tokens:
                break
        path = workspace / "sessions" / conversation_id / f"session_{number}.jsonl"
        paths.append(write_jsonl(path, records))
        number += 1
    return paths


def read_input(settings: Settings, conversation_id: str) -> ConversationInput:
    with open_store(settings.db_path, read_only=True) as con:
        return gather_input(con, conversation_id, "test")


def llm_summarizer(server: ScriptedOpenAIServer) -> SummarizerConfig:
    client = LLMClient(
        LLMConfig(base_url=server.base_url, model="m", max_retries=0, retry_backoff=0.0)
    )
    return SummarizerConfig(llm=client)


def summary_rows(settings: Settings, conversation_id: str) -> list[dict[str, Any]]:
    """Rows of the `summaries` view, active first, by level and index."""
    with open_store(settings.db_path, read_only=True) as con:
        return fetch_dicts(
            con,
            "SELECT * FROM summaries WHERE conversation_id = ? "
            "ORDER BY state, level, chunk_index, group_index, id",
            [conversation_id],
        )


def add_fact(settings: Settings, conversation_id: str, fact_id: str, text: str, at: datetime):
    """A fact row as the fact write path stores it (kind 'fact', active)."""
    with open_store(settings.db_path) as con:
        con.execute(
            "INSERT INTO memories (id, kind, content, conversation_id, created_at) "
            "VALUES (?, 'fact', ?, ?, ?)",
            [fact_id, text, conversation_id, at],
        )


LONG_REPLY = (
    "April is cherry blossom season, so the parks around the Philosopher's Path and Maruyama "
    "are full, hotels book out months ahead and the trains from Osaka are crowded at weekends; "
    "book early and plan the temple visits for weekday mornings."
)


# --- Input -------------------------------------------------------------------------------------


def test_input_renders_sessions_in_time_order_with_entries_and_new_facts(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    folder = settings.workspace / "sessions" / "trip"
    # session_10 happened before session_2: time order wins over file names.
    write_jsonl(
        folder / "session_2.jsonl",
        [
            {
                "role": "user",
                "name": "Ana",
                "content": "We land in Kyoto on Monday.",
                "created_at": "2025-04-07T09:00:00Z",
            }
        ],
    )
    write_jsonl(
        folder / "session_10.jsonl",
        [
            {
                "role": "user",
                "name": "Ana",
                "content": "Should we go to Kyoto?",
                "created_at": "2025-01-15T20:15:00Z",
            },
            {"role": "assistant", "content": LONG_REPLY},
        ],
    )
    entry = settings.workspace / "entries" / "trip" / "turns" / "user" / "t1.md"
    entry.parent.mkdir(parents=True)
    entry.write_text("---\nrole: user\ncreated_at: 2025-05-01T00:00:00Z\n---\nBook the ryokan.\n")
    sync_files(settings)

    content = read_input(settings, "trip").content

    assert content == (
        "[session_10, 15 January 2025, 20:15]\n"
        "Ana: Should we go to Kyoto?\n"
        f"Assistant: {LONG_REPLY}\n\n"
        "[session_2, 7 April 2025, 09:00]\n"
        "Ana: We land in Kyoto on Monday.\n\n"
        "[conversation entries]\n"
        "User: Book the ryokan."
    )

    # Facts join the input until a summary covers them; later facts join the next one.
    add_fact(settings, "trip", "f1", "Ana is afraid of flying.", datetime.now(UTC))
    gathered = read_input(settings, "trip")
    assert gathered.content.endswith(f"{FACTS_HEADER}\n- Ana is afraid of flying.")
    assert (gathered.turns, gathered.sessions, gathered.facts) == (4, 3, 1)
    summarize_conversation(settings, "trip", config=SummarizerConfig(), force=True)
    add_fact(settings, "trip", "f2", "Ana prefers window seats.", datetime.now(UTC))
    gathered = read_input(settings, "trip")
    assert gathered.content.endswith(f"{FACTS_HEADER}\n- Ana prefers window seats.")
    assert "afraid of flying" not in gathered.content
    assert gathered.prior is not None and gathered.prior.id == "trip:summary:L3:final"


def test_turns_counted_when_chunked_are_not_counted_again(tmp_path: Path) -> None:
    """A turn's token count comes with its input from its chunk (one turn a chunk), and only
    while the chunk still holds the turn's text; the summary is the one counting would give."""
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", LEVEL_TOKENS[SummaryLevel.HIERARCHICAL])
    sync_files(settings)
    assert read_input(settings, "c1").counted == ()  # no chunks yet
    build_chunks(settings)
    gathered = read_input(settings, "c1")
    assert len(gathered.counted) == gathered.turns
    for start, end, tokens in gathered.counted:
        assert tokens == count_tokens(gathered.content[start:end])
        assert gathered.content[start - 1] == "\n"  # a whole line of the input

    # A turn whose chunk holds other text (a chunk of older text) is counted anew.
    first_turn = gathered.content[slice(*gathered.counted[0][:2])]
    with open_store(settings.db_path) as con:
        con.execute("UPDATE chunks SET text = 'Dana: older text.' WHERE text = ?", [first_turn])
    changed = read_input(settings, "c1")
    assert len(changed.counted) == changed.turns - 1
    assert changed.counted[0] == gathered.counted[1]

    config = SummarizerConfig()
    with_counts = summarize(gathered.content, config, None, CONTENT_TYPE, counted=gathered.counted)
    assert with_counts.level is SummaryLevel.HIERARCHICAL
    assert with_counts == summarize(gathered.content, config, None, CONTENT_TYPE)


# --- Every level, through the scripted LLM server and the extractive default --------------------


@pytest.mark.parametrize("engine", ["llm", "extractive"])
@pytest.mark.parametrize("level", list(LEVEL_TOKENS))
def test_each_level_is_stored_as_its_tree(
    tmp_path: Path, openai_server: ScriptedOpenAIServer, engine: str, level: SummaryLevel
) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", LEVEL_TOKENS[level])
    sync_files(settings)
    content = read_input(settings, "c1").content
    input_tokens = count_tokens(content)
    assert determine_level(input_tokens) is level  # the conversation is in the band
    openai_server.handler = by_prompt
    config = llm_summarizer(openai_server) if engine == "llm" else SummarizerConfig()

    run = summarize_conversation(settings, "c1", config=config)

    chunks = (
        chunk_text(content) if level in (SummaryLevel.DETAILED, SummaryLevel.HIERARCHICAL) else []
    )
    groups = math.ceil(len(chunks) / 5) if level is SummaryLevel.HIERARCHICAL else 0
    assert (run.status, run.level, run.method, run.generation) == ("written", level, engine, 1)
    assert (run.l1, run.l2, run.input_tokens) == (len(chunks), groups, input_tokens)
    rows = summary_rows(settings, "c1")
    assert [r["id"] for r in rows] == (
        [f"c1:summary:L1:{i}" for i in range(len(chunks))]
        + [f"c1:summary:L2:{g}" for g in range(groups)]
        + ["c1:summary:L3:final"]
    )
    assert all(r["state"] == "active" and r["summary_level"] == level.value for r in rows)
    assert [r["is_final"] for r in rows] == [False] * (len(chunks) + groups) + [True]
    for index, (row, chunk) in enumerate(zip(rows, chunks, strict=False)):
        assert (row["level"], row["chunk_index"]) == (1, index)
        expected_group = index // 5 if level is SummaryLevel.HIERARCHICAL else None
        assert row["parent_group"] == expected_group
        assert row["input_tokens"] == count_tokens(chunk)
        assert row["output_tokens"] == count_tokens(row["content"])
    for group, row in enumerate(rows[len(chunks) : len(chunks) + groups]):
        assert (row["level"], row["group_index"]) == (2, group)
    final = rows[-1]
    assert final["input_tokens"] == input_tokens
    assert final["output_tokens"] == count_tokens(final["content"])
    assert final["compression_ratio"] == pytest.approx(final["output_tokens"] / input_tokens)
    if engine == "llm":
        if level is SummaryLevel.HIERARCHICAL:
            assert final["content"] == f"Final synthesis of {groups} parts."
            assert rows[len(chunks)]["content"] == "Synthesis of sections 1-5."
        elif level is SummaryLevel.DETAILED:
            assert final["content"] == f"Synthesis of sections 1-{len(chunks)}."
        assert [r["content"] for r in rows[: len(chunks)]] == [
            f"L1 summary of section {i + 1}." for i in range(len(chunks))
        ]
    else:  # the extractive default meets each level's target compression (seed 001 §3.1)
        target = {"BRIEF": 0.20, "STANDARD": 0.12, "DETAILED": 0.07, "HIERARCHICAL": 0.05}
        assert 0 < final["compression_ratio"] <= target[level.value] + 0.01
        # Every sentence says who said it, once: never "Dana: Ravi: ..." at any level.
        labels = "|".join(SPEAKERS)
        for row in rows:
            assert not re.search(rf"\b({labels}): ({labels}):", row["content"]), row["id"]
    stored = final_summary("c1", settings)
    assert stored is not None and stored.content == final["content"] and stored.is_final


@pytest.mark.parametrize("level", list(LEVEL_TOKENS))
def test_every_summary_leads_back_to_what_it_summarises(
    tmp_path: Path, level: SummaryLevel
) -> None:
    """Issue 13 item 11: `source_ids` name the turns (and facts) an L1 or single summary covers,
    the L1 rows an L2 covers, and the L2 (or L1) rows the L3 was made from."""
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", LEVEL_TOKENS[level])
    sync_files(settings)
    add_fact(settings, "c1", "f1", "Dana is afraid of flying.", datetime.now(UTC))
    with open_store(settings.db_path) as con:
        con.execute("UPDATE memories SET category = 'profile' WHERE id = 'f1'")
        con.execute(
            "INSERT INTO memories (id, kind, content, conversation_id, user_id, created_at) "
            "VALUES ('f_owned', 'fact', 'Ravi keeps a diary of his pin codes.', 'c1', 'ravi', ?)",
            [datetime.now(UTC)],
        )

    summarize_conversation(settings, "c1", config=SummarizerConfig())

    with open_store(settings.db_path, read_only=True) as con:
        rows = fetch_dicts(
            con,
            "SELECT s.id, s.level, s.chunk_index, s.group_index, s.parent_group, m.source_ids, "
            "m.attributes FROM summaries s JOIN memories m ON m.id = s.id "
            "WHERE s.state = 'active' ORDER BY s.level, s.chunk_index, s.group_index",
        )
        episodes = [
            r[0] for r in con.execute("SELECT id FROM episodes ORDER BY path, line").fetchall()
        ]
        content = read_input(settings, "c1").content
    by_level = {n: [r for r in rows if r["level"] == n] for n in (1, 2, 3)}
    [final] = by_level[3]
    assert "pin codes" not in content  # a user's own facts are not the conversation's
    if level in (SummaryLevel.BRIEF, SummaryLevel.STANDARD):
        assert final["source_ids"] == [*episodes, "f1"]
    else:
        covered = [i for r in by_level[1] for i in r["source_ids"]]
        assert set(covered) == {*episodes, "f1"}  # every turn and fact is under some L1
        # each L1 names only what its own part of the input says
        for row in by_level[1]:
            assert 0 < len(row["source_ids"]) < len(episodes)
        if level is SummaryLevel.DETAILED:
            assert final["source_ids"] == [r["id"] for r in by_level[1]]
        else:
            assert final["source_ids"] == [r["id"] for r in by_level[2]]
            for group in by_level[2]:
                assert group["source_ids"] == [
                    r["id"] for r in by_level[1] if r["parent_group"] == group["group_index"]
                ]
    categories = json.loads(final["attributes"])["source_categories"]
    assert categories == ["event", "profile"]  # turns read as `event`, and the fact's category


def test_too_short_conversation_gets_no_summary_and_retires_an_old_one(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    [path] = write_conversation(settings.workspace, "c1", 400)
    sync_files(settings)
    assert summarize_conversation(settings, "c1", config=SummarizerConfig()).status == "written"

    write_jsonl(path, [{"role": "user", "name": "Dana", "content": "Hi there."}])
    sync_files(settings)
    run = summarize_conversation(settings, "c1", config=SummarizerConfig())

    assert (run.status, run.level, run.retired) == ("none", SummaryLevel.NONE, 1)
    assert final_summary("c1", settings) is None
    assert [(r["id"], r["state"]) for r in summary_rows(settings, "c1")] == [
        ("c1:summary:L3:final#g1", "soft_deleted")
    ]


# --- Replacement -------------------------------------------------------------------------------


def test_second_summary_rolls_the_prior_and_retires_the_first_tree(
    tmp_path: Path, openai_server: ScriptedOpenAIServer
) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", 8000)
    sync_files(settings)
    openai_server.handler = by_prompt
    config = llm_summarizer(openai_server)
    first = summarize_conversation(settings, "c1", config=config)
    first_rows = summary_rows(settings, "c1")
    assert first.level is SummaryLevel.DETAILED and len(first_rows) == first.l1 + 1

    write_conversation(settings.workspace, "c1", 300, seed=7, first_session=30)
    add_fact(settings, "c1", "f1", "Ravi moved to Leipzig.", datetime.now(UTC))
    sync_files(settings)
    openai_server.handler = lambda body: Reply.text(
        "The new final summary." if "Synthesize" in body["messages"][-1]["content"] else "New L1."
    )
    second = summarize_conversation(settings, "c1", config=config)

    assert (second.status, second.generation, second.retired) == ("written", 2, len(first_rows))
    prompts = [r["body"]["messages"][-1]["content"] for r in openai_server.chat_requests]
    assert first.preview in prompts[-1]  # the prior L3 is the final synthesis' context
    assert any("Ravi moved to Leipzig." in p for p in prompts)  # the new fact is input
    rows = summary_rows(settings, "c1")
    active = [r for r in rows if r["state"] == "active"]
    retired = [r for r in rows if r["state"] == "soft_deleted"]
    assert [r["id"] for r in retired] == [r["id"] + "#g1" for r in first_rows]
    assert [r["content"] for r in retired] == [r["content"] for r in first_rows]
    assert all(r["valid_until"] is not None for r in retired)
    assert [r["content"] for r in active] == ["New L1."] * second.l1 + ["The new final summary."]
    stored = final_summary("c1", settings)
    assert stored is not None and stored.generation == 2
    history = summary_tree("c1", settings, include_retired=True)
    assert {n.replaced_by for n in history if not n.active} == {"c1:summary:L3:final"}


def test_a_failed_write_leaves_the_previous_tree_untouched(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", 8000)
    sync_files(settings)
    first = summarize_conversation(settings, "c1", config=SummarizerConfig())
    before = summary_rows(settings, "c1")
    # The grown conversation needs one more L1, whose id a foreign row already holds: the
    # insert fails after the old tree was retired, inside the same transaction.
    write_conversation(settings.workspace, "c1", 3000, seed=3, first_session=40)
    sync_files(settings)
    add_fact(settings, "c1", f"c1:summary:L1:{first.l1}", "squatter", datetime.now(UTC))

    with pytest.raises(duckdb.ConstraintException):
        summarize_conversation(settings, "c1", config=SummarizerConfig())

    assert summary_rows(settings, "c1") == before


def test_unchanged_conversation_is_skipped_unless_forced(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", 1500)
    sync_files(settings)
    config = SummarizerConfig()
    assert summarize_conversation(settings, "c1", config=config).generation == 1

    again = summarize_conversation(settings, "c1", config=config)
    assert (again.status, again.generation) == ("unchanged", 1)
    assert len(summary_rows(settings, "c1")) == 1

    forced = summarize_conversation(settings, "c1", config=config, force=True)
    assert (forced.status, forced.generation, forced.retired) == ("written", 2, 1)


def test_failing_llm_keeps_the_previous_summary_and_records_the_failure(
    tmp_path: Path, openai_server: ScriptedOpenAIServer
) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", 8000)
    sync_files(settings)
    openai_server.handler = by_prompt
    config = llm_summarizer(openai_server)
    summarize_conversation(settings, "c1", config=config)
    before = summary_rows(settings, "c1")

    def fail_section_two(body: dict[str, Any]) -> Reply:
        if "Section 2 of" in body["messages"][-1]["content"]:
            return Reply.status(500)
        return by_prompt(body)

    openai_server.handler = fail_section_two
    with pytest.raises(SummarizationError, match="chunk 2/"):
        summarize_conversation(settings, "c1", config=config, force=True)

    assert summary_rows(settings, "c1") == before
    with open_store(settings.db_path, read_only=True) as con:
        events = fetch_dicts(con, "SELECT node, op, status, detail FROM events ORDER BY ts, status")
    assert [(e["node"], e["status"]) for e in events] == [
        ("summaries", "ok"),
        ("summaries", "error"),
    ]
    assert "chunk 2/" in events[1]["detail"] and "HTTP 500" in events[1]["detail"]


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_summarize_show_and_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", 1500)
    write_jsonl(
        settings.workspace / "sessions" / "c2" / "s.jsonl", [{"role": "user", "content": "Hi!"}]
    )
    sync_files(settings)
    paths = [
        "--workspace",
        str(settings.workspace),
        "--db",
        str(settings.db_path),
        "--index-dir",
        str(settings.index_dir),
    ]

    assert main(["summarize", *paths, "--json"]) == 0
    runs = {run["conversation_id"]: run for run in json.loads(capsys.readouterr().out)}
    assert runs["c1"]["level"] == "STANDARD" and runs["c2"]["level"] == "NONE"

    assert main(["summary", "c1", *paths]) == 0
    shown = capsys.readouterr().out
    assert "c1:summary:L3:final" in shown and runs["c1"]["preview"] in shown
    assert main(["summary", "c2", *paths]) == 1

    # `summarize` embedded and indexed the summary: search finds it by kind.
    hits = search("schedule", settings=settings, kind="summary", min_score=0.0)
    assert [hit.id for hit in hits] == ["c1:summary:L3:final"]
