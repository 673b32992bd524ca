"""The truth suite's judge counts what it claims to count: a block that tells something stale,
replaced, out of scope or incomplete is caught (a judge that cannot fail would prove nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memory_dag.memories.categories import load_categories
from tests.scenarios.harness import StoryRun
from tests.scenarios.steps import Check, Context, Story


def memory(content: str, **fields: Any) -> dict[str, Any]:
    row = {"id": content[:8], "kind": "fact", "content": content, "speaker": None,
           "user_id": None, "conversation_id": "demo", "category": "preferences",
           "state": "active", "replaced_by": None}  # fmt: skip
    return {**row, **fields}


ROWS = [
    memory("Alice loves tea.", user_id="alice"),
    memory("Bob loves coffee.", user_id="bob"),
    memory("Alice loves milk.", user_id="alice", state="soft_deleted", replaced_by="x"),
    memory("Alice loves cake.", user_id="alice", state="soft_deleted"),
    memory("Alice is allergic to nuts.", user_id="alice", category="profile"),
    memory("Deploy:\n1. Build", kind="procedural", category="procedural", user_id="alice"),
    memory("Carol lives in Rome.", conversation_id="other"),
    memory("I love pie.", kind="episode", speaker="Alice", category=None, user_id="alice"),
]


def judge(tmp_path: Path, text: str, context: Context, stale: set[str] = frozenset()) -> dict:
    run = StoryRun(Story("judge", "", []), tmp_path)
    run.stale = set(stale)
    run._judge(text, context, ROWS, "test")
    return dict(run.tally.counts)


def test_a_clean_block_counts_nothing(tmp_path: Path) -> None:
    text = "## Relevant memories\n[preferences] Alice loves tea.\n[user] Alice: I love pie."
    counts = judge(tmp_path, text, Context("q", "demo", user="alice", agent="supervisor"))
    assert counts == {"stale_shown": 0, "replaced_shown": 0, "out_of_scope_shown": 0, "lost": 0}


def test_each_kind_of_wrong_line_is_counted(tmp_path: Path) -> None:
    alice = Context("q", "demo", user="alice")
    assert judge(tmp_path, "[preferences] Bob loves coffee.", alice)["out_of_scope_shown"] == 1
    assert judge(tmp_path, "[preferences] Carol lives in Rome.", alice)["out_of_scope_shown"] == 1
    assert judge(tmp_path, "[procedural] Deploy: 1. Build", alice)["out_of_scope_shown"] == 1
    stylist = Context("q", "demo", user="alice", agent="stylist")
    assert (
        judge(tmp_path, "[profile] Alice is allergic to nuts.", stylist)["out_of_scope_shown"] == 1
    )
    assert judge(tmp_path, "[preferences] Alice loves milk.", alice)["replaced_shown"] == 1
    assert judge(tmp_path, "- +created: [preferences] Alice loves cake", alice)["stale_shown"] == 1
    assert judge(tmp_path, "[user] Alice: I love pie.", alice, {"I love pie"})["stale_shown"] == 1
    # A removal bullet says what is gone: not stale.
    assert judge(tmp_path, "- ×deleted: [preferences] Alice loves cake", alice)["stale_shown"] == 0


def test_expected_memories_and_lines_that_are_missing_are_lost(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    story = Story("lost", "", [Check(active=["Nobody remembers this."])])
    run = StoryRun(story, tmp_path)
    run._rows = lambda: ROWS  # type: ignore[method-assign]
    run.dirty = False
    run._check(story.steps[0], "test")  # type: ignore[arg-type]
    assert run.tally.counts["lost"] == 1 and run.failures


def test_the_judge_reads_the_categories_file() -> None:
    assert "profile" not in load_categories().allowlist("stylist")
