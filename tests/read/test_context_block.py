"""The context block: layout, delta header, summary, memories without scores, related bullets,
reflection, the token budget, and a busy store."""

from __future__ import annotations

import json
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.ingest.tokens import count_tokens
from memory_dag.pipeline import run_all, run_first_stages
from memory_dag.read.context_block import build_context, injection_hook
from memory_dag.read.query import MemoryFull, MemoryQuery, query_memory
from memory_dag.read.retriever import RetrievalConfig
from memory_dag.scope import Scope
from memory_dag.store.connection import open_store
from memory_dag.summaries.conversation_summaries import final_id
from tests.conftest import write_jsonl
from tests.read.test_retrieval import NOW, add_memories, add_relation
from tests.store.test_store import hold_lock

SUMMARY = "Dana moved to Lisbon this spring and talked about settling in and her cat Miso."
REFLECTION = "This week Dana focused on settling into Lisbon and on her Portuguese lessons."
QUIET = RetrievalConfig(track_access=False)
CHANGES = [  # (rev, memory, event)
    (1, "f_lisbon", "created"),
    (2, "f_tea", "created"),
    (3, "f_portuguese", "created"),
    (4, "f_tea", "updated"),
    (5, "f_old", "soft_deleted"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """One conversation with turns, facts, a relation, a change log, a summary, a reflection."""
    root = tmp_path_factory.mktemp("context-store")
    write_jsonl(
        root / "workspace" / "sessions" / "conv-a" / "s1.jsonl",
        [
            {"role": "user", "content": "I adopted a cat named Miso last week.", "id": "t1",
             "name": "Dana", "created_at": "2026-05-01T10:00:00Z"},
            {"role": "assistant", "content": "Congratulations on adopting Miso!", "id": "t2"},
        ],
    )  # fmt: skip
    write_jsonl(
        root / "workspace" / "sessions" / "conv-a" / "s2.jsonl",
        [{"role": "user", "content": "Miso loves the sunny balcony of the new flat.", "id": "u1",
          "name": "Dana", "created_at": "2026-05-20T10:00:00Z"}],
    )  # fmt: skip
    settings = Settings(
        workspace=root / "workspace", db_path=root / "memory.duckdb", index_dir=root / "index"
    )
    run_first_stages(settings)
    add_memories(
        settings,
        [
            {"id": "f_lisbon", "content": "Dana moved to Lisbon in May", "category": "profile",
             "conversation_id": "conv-a", "importance": 4},
            {"id": "f_tea", "content": "Dana prefers green tea in the morning",
             "category": "preferences", "conversation_id": "conv-a"},
            {"id": "f_portuguese", "content": "Dana plans to learn Portuguese with a tutor",
             "category": "goals", "conversation_id": "conv-a"},
            {"id": "f_old", "content": "Dana lives in Berlin", "category": "profile",
             "conversation_id": "conv-a", "valid_until": NOW, "state": "soft_deleted"},
            {"id": "r_week", "kind": "reflection", "content": REFLECTION,
             "created_at": NOW - timedelta(days=1)},
            {"id": final_id("conv-a"), "kind": "summary", "content": SUMMARY,
             "conversation_id": "conv-a",
             "attributes": json.dumps({"level": 3, "summary_level": "STANDARD", "generation": 1,
                                       "is_final": True})},
        ],
    )  # fmt: skip
    add_relation(settings, "f_tea", "f_portuguese", 0.8)
    with open_store(settings.db_path) as con:
        for rev, memory_id, event in CHANGES:
            con.execute(
                "INSERT INTO change_log (id, conversation_id, rev, memory_id, event, ts) "
                "VALUES (?, 'conv-a', ?, ?, ?, ?)",
                [f"c{rev}", rev, memory_id, event, NOW + timedelta(minutes=rev)],
            )
        con.execute("INSERT INTO conversation_revisions VALUES ('conv-a', 5)")
    run_first_stages(settings)
    return settings


def block(
    store: Settings,
    message: str = "What does Dana drink in the morning?",
    agent: str | None = None,
    **options,
):
    scope = Scope.of(conversation_id="conv-a", agent=agent)
    return build_context(message, scope, settings=store, config=QUIET, now=NOW, **options)


def test_the_block_has_every_section_in_order(store: Settings) -> None:
    made = block(store, since_rev=2, max_memories=1)

    assert made.text.splitlines() == [
        "Memory updates since rev 2:",
        "- −soft_deleted: [profile] Dana lives in Berlin",
        "- ↑updated: [preferences] Dana prefers green tea in the morning",
        "- +created: [goals] Dana plans to learn Portuguese with a tutor (imp=2)",
        "## Conversation summary",
        SUMMARY,
        "## Relevant memories",
        "[profile] Dana moved to Lisbon in May",  # context: all, though not about tea
        "[preferences] Dana prefers green tea in the morning",
        "## Related",
        "[goals] Dana plans to learn Portuguese with a tutor",
        "## Weekly reflection",
        REFLECTION,
    ]
    assert made.rev == 5
    assert made.tokens == count_tokens(made.text)
    assert made.sections == {"delta": 4, "summary": 1, "memories": 2, "related": 1,
                             "reflection": 1}  # fmt: skip


def test_memories_show_role_or_category_and_no_scores(store: Settings) -> None:
    made = block(store, "Tell me about the cat Miso", max_memories=5)
    lines = made.text.splitlines()
    memories = lines[lines.index("## Relevant memories") + 1 :]
    memories = memories[: next((i for i, x in enumerate(memories) if x.startswith("## ")), None)]

    assert "[user] Dana: I adopted a cat named Miso last week." in memories
    assert all(re.fullmatch(r"\[[a-z_]+\] \S.*", line) for line in memories)
    assert not re.search(r"\d\.\d{3}", made.text)  # no scores anywhere
    assert "Berlin" not in "\n".join(memories)  # soft-deleted memories are never shown
    assert SUMMARY not in memories  # the summary has its own section


def test_the_delta_header_appears_only_when_something_changed(store: Settings) -> None:
    assert not block(store, since_rev=5).text.startswith("Memory updates")
    default = block(store).text.splitlines()
    assert default[0] == "Memory updates since rev 2:"  # the last 3 revisions
    assert sum(line.startswith("- ") for line in default[:4]) == 3


def test_the_budget_is_never_exceeded_and_the_block_fills_in_order(store: Settings) -> None:
    for budget in (8, 20, 40, 60, 70, 90, 120, 140, 220, 500):
        made = block(store, since_rev=0, max_tokens=budget)
        assert count_tokens(made.text) == made.tokens <= budget, budget

    assert block(store, since_rev=0, max_tokens=40).sections == {"delta": 3}
    cut = block(store, since_rev=0, max_tokens=70)
    assert cut.sections == {"delta": 4, "summary": 1}
    assert cut.text.endswith("…")  # the summary paragraph is cut to the room left
    fuller = block(store, since_rev=0, max_tokens=130)
    assert set(fuller.sections) == {"delta", "summary", "memories"}  # no reflection yet
    assert block(store, since_rev=0, max_tokens=500).sections["reflection"] == 1


def test_the_summary_takes_at_most_its_share(store: Settings) -> None:
    made = block(store, since_rev=5, max_tokens=40)

    summary = made.text.splitlines()[1]
    assert made.text.startswith("## Conversation summary")
    assert count_tokens(summary) <= 40 * 0.4 and summary.endswith("…")
    assert "## Relevant memories" in made.text


def test_an_agent_sees_only_its_categories(store: Settings) -> None:
    made = block(store, "What is Dana learning?", agent="planner", since_rev=5)
    lines = made.text.splitlines()
    memories = lines[lines.index("## Relevant memories") + 1 :]

    assert memories[0] == "[goals] Dana plans to learn Portuguese with a tutor"
    assert not [m for m in memories if m.startswith(("[preferences]", "[profile]", "[user]"))]


def test_the_current_session_can_be_left_out(store: Settings) -> None:
    with_current = block(store, "Miso balcony flat", since_rev=5).text
    without = block(store, "Miso balcony flat", since_rev=5, exclude_session="s2").text

    assert "sunny balcony" in with_current
    assert "sunny balcony" not in without


def test_a_busy_store_still_gives_memories_and_says_what_is_missing(store: Settings) -> None:
    holder = hold_lock(store.db_path, 5)
    try:
        made = block(store)
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipes

    assert made.rev is None
    assert "## Relevant memories" in made.text and "Memory updates" not in made.text
    assert any("store busy" in note for note in made.notes)


def test_the_injection_hook_returns_the_block(store: Settings) -> None:
    hook = injection_hook(store, max_tokens=120, config=QUIET)

    text = hook("What does Dana drink in the morning?", "conv-a")

    assert "[preferences] Dana prefers green tea in the morning" in text
    assert count_tokens(text) <= 120


def test_cli_context(store: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    paths = ["--db", str(store.db_path), "--index-dir", str(store.index_dir)]

    code = main(["context", "green tea", "--conversation", "conv-a", "--max-tokens", "80",
                 "--since-rev", "5", *paths])  # fmt: skip

    captured = capsys.readouterr()
    assert code == 0
    assert "[preferences] Dana prefers green tea in the morning" in captured.out
    assert count_tokens(captured.out.strip()) <= 80
    assert "rev 5" in captured.err


# --- issue 13 item 4: the README's demo tells the agent what is current ------------------------

README_WORKSPACE = Path(__file__).resolve().parents[2] / "data" / "workspace"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The README's first command on the sample workspace (without Dagster): every stage."""
    root = tmp_path_factory.mktemp("readme-demo")
    shutil.copytree(README_WORKSPACE, root / "workspace")
    settings = Settings(
        workspace=root / "workspace", db_path=root / "memory.duckdb", index_dir=root / "index"
    )
    run_all(settings)
    return settings


def test_the_demo_context_says_sam_hates_pizza_and_nothing_older_as_current(demo: Settings) -> None:
    made = build_context(
        "what does Sam think of pizza", Scope.of(conversation_id="demo"), settings=demo,
        config=QUIET, max_tokens=600,
    )  # fmt: skip
    lines = made.text.splitlines()
    memories = lines[lines.index("## Relevant memories") + 1 :]

    assert "[preferences] Sam now hates pizza." in memories
    assert not [line for line in lines if "I love pizza" in line]  # superseded by the fact
    loves = [line for line in lines if "Sam loves pizza" in line]
    assert all(line.startswith("- ×deleted:") for line in loves)  # only as what is gone
    summary = lines[lines.index("## Conversation summary") + 1]
    assert not summary.rstrip().endswith("pizza was his favourite food.")  # no dangling "This"
    assert "[s1" not in summary and "[2026-11" not in summary


def test_a_superseded_turn_ranks_below_its_fact_and_is_marked(demo: Settings) -> None:
    request = MemoryQuery(
        agent="supervisor", query="Sam pizza favourite food", top_k=60, threshold=0.0,
        return_="full",
    )  # fmt: skip
    results = query_memory(
        request, scope=Scope.of(conversation_id="demo"), settings=demo, config=QUIET
    ).results
    texts = [r.text for r in results]
    fact = texts.index("Sam now hates pizza.")
    [old] = [r for r in results if "I love pizza" in r.text]
    assert texts.index(old.text) > fact
    assert isinstance(old, MemoryFull) and old.superseded_by is not None
    bullets = query_memory(
        request.model_copy(update={"return_": "bullets"}), scope=Scope.of(conversation_id="demo"),
        settings=demo, config=QUIET,
    ).results  # fmt: skip
    [line] = [b.text for b in bullets if "I love pizza" in b.text]
    assert line.startswith("[event, superseded]")
