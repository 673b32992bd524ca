"""Markdown export of summaries, facts and turns: layout, front matter, mirroring, git."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from memory_dag.config import Settings
from memory_dag.ingest.files import sync_files
from memory_dag.store.connection import open_store
from memory_dag.summaries.conversation_summaries import summary_tree
from memory_dag.summaries.export import export_store
from memory_dag.summaries.refresh import summarize_conversation
from memory_dag.summaries.summarizer import SummarizerConfig, SummaryLevel
from tests.conftest import write_jsonl
from tests.summaries.test_conversation_summaries import add_fact, settings_in, write_conversation


def read_entry(path: Path) -> tuple[dict[str, Any], str]:
    """(front matter, body) of an exported file."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body.strip()


def summarized(tmp_path: Path, tokens: int = 8000) -> Settings:
    settings = settings_in(tmp_path)
    write_conversation(settings.workspace, "c1", tokens)
    sync_files(settings)
    summarize_conversation(settings, "c1", config=SummarizerConfig())
    return settings


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.md"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def test_summaries_export_in_the_entries_layout_with_front_matter(tmp_path: Path) -> None:
    settings = summarized(tmp_path)
    tree = summary_tree("c1", settings)
    l1 = [node for node in tree if node.level == 1]
    target = tmp_path / "export"

    report = export_store(settings, target)

    folder = target / "entries" / "c1"
    assert files_under(folder) == sorted(
        [f"summaries/L1/chunk_{i}.md" for i in range(len(l1))] + ["summaries/L3/final.md"]
    )
    assert len(report.written) == len(tree) and report.commit is None
    front, body = read_entry(folder / "summaries" / "L3" / "final.md")
    final = tree[-1]
    assert body == final.content
    assert front["id"] == "c1:summary:L3:final"
    assert front["role"] == "summary" and front["level"] == 3 and front["is_final"] is True
    assert front["summary_level"] == SummaryLevel.DETAILED.value
    assert (front["input_tokens"], front["output_tokens"]) == (
        final.input_tokens,
        final.output_tokens,
    )
    assert front["compression_ratio"] == round(final.compression_ratio, 4)
    assert front["created_at"].endswith("Z")
    chunk, body = read_entry(folder / "summaries" / "L1" / "chunk_1.md")
    assert (chunk["id"], chunk["chunk_index"], chunk["parent_group"]) == (
        "c1:summary:L1:1",
        1,
        None,
    )
    assert body == l1[1].content


def test_export_mirrors_the_store_and_never_removes_foreign_files(tmp_path: Path) -> None:
    settings = summarized(tmp_path)
    target = tmp_path / "export"
    export_store(settings, target)
    folder = target / "entries" / "c1"
    foreign = folder / "summaries" / "L1" / "notes-by-hand.md"
    foreign.write_text("---\nid: mine\n---\nKeep me.\n")

    again = export_store(settings, target)
    assert again.written == [] and again.removed == []

    # The conversation shrinks to a STANDARD summary: the old tree is retired in the store.
    for path in (settings.workspace / "sessions" / "c1").glob("*.jsonl"):
        path.unlink()
    write_conversation(settings.workspace, "c1", 1500, seed=5)
    sync_files(settings)
    summarize_conversation(settings, "c1", config=SummarizerConfig())
    old_chunks = [p.name for p in sorted((folder / "summaries" / "L1").glob("chunk_*.md"))]

    report = export_store(settings, target)

    assert files_under(folder) == sorted(
        [
            "summaries/L1/notes-by-hand.md",
            "summaries/L3/final.md",
            "deleted/summaries/L3/final__g1.md",
        ]
        + [f"deleted/summaries/L1/{name[:-3]}__g1.md" for name in old_chunks]
    )
    assert sorted(report.removed) == sorted(f"entries/c1/summaries/L1/{n}" for n in old_chunks)
    front, _ = read_entry(folder / "deleted" / "summaries" / "L3" / "final__g1.md")
    assert front["id"] == "c1:summary:L3:final#g1" and front["deleted_at"]
    assert front["replaced_by"] == "c1:summary:L3:final"
    assert read_entry(folder / "summaries" / "L3" / "final.md")[0]["summary_level"] == "STANDARD"


def test_facts_and_turns_export(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    write_jsonl(
        settings.workspace / "sessions" / "c1" / "s1.jsonl",
        [
            {
                "role": "user",
                "name": "Dana",
                "content": "I moved to Leipzig.",
                "id": "t1",
                "created_at": "2025-03-01T10:00:00Z",
            },
            {
                "role": "assistant",
                "content": "How is the new flat?",
                "id": "t2",
                "created_at": "2025-03-01T10:00:05Z",
            },
        ],
    )
    sync_files(settings)
    add_fact(settings, "c1", "fact/1", "Dana lives in Leipzig.", datetime(2025, 3, 2, tzinfo=UTC))
    add_fact(settings, "c1", "fact-0", "Dana lives in Berlin.", datetime(2025, 1, 1, tzinfo=UTC))
    with open_store(settings.db_path) as con:
        con.execute(
            "UPDATE memories SET valid_until = now(), state = 'soft_deleted', "
            "replaced_by = 'fact/1' WHERE id = 'fact-0'"
        )

    export_store(settings, tmp_path / "out", facts=True, turns=True)

    folder = tmp_path / "out" / "entries" / "c1"
    assert files_under(folder) == [
        "deleted/facts/20250101T000000Z__fact-0.md",
        "facts/20250302T000000Z__fact_1.md",
        "turns/assistant/20250301T100005Z__" + episode_file_id(settings, "t2"),
        "turns/user/20250301T100000Z__" + episode_file_id(settings, "t1"),
    ]
    fact, body = read_entry(folder / "facts" / "20250302T000000Z__fact_1.md")
    assert (fact["id"], fact["role"], body) == ("fact/1", "memory", "Dana lives in Leipzig.")
    gone, _ = read_entry(folder / "deleted" / "facts" / "20250101T000000Z__fact-0.md")
    assert gone["replaced_by"] == "fact/1" and gone["deleted_at"]
    turn, body = read_entry(
        folder / "turns" / "user" / ("20250301T100000Z__" + episode_file_id(settings, "t1"))
    )
    assert (turn["speaker"], turn["turn_id"], body) == ("Dana", "t1", "I moved to Leipzig.")

    # A later export of the summaries alone leaves the facts and turns it did not look at.
    assert export_store(settings, tmp_path / "out").removed == []
    assert len(files_under(folder)) == 4


def episode_file_id(settings: Settings, turn_id: str) -> str:
    with open_store(settings.db_path, read_only=True) as con:
        row = con.execute("SELECT id FROM episodes WHERE turn_id = ?", [turn_id]).fetchone()
    return f"{row[0]}.md"


def test_export_commits_when_the_target_is_a_git_repository(tmp_path: Path) -> None:
    settings = summarized(tmp_path, tokens=1500)
    target = tmp_path / "memory-repo"
    target.mkdir()
    git(target, "init", "-q")
    (target / "unrelated.txt").write_text("staged by someone else\n")
    git(target, "add", "unrelated.txt")

    first = export_store(settings, target)

    assert first.commit is not None and first.commit == git(target, "rev-parse", "HEAD").strip()
    committed = git(target, "show", "--name-only", "--format=", "HEAD").split()
    assert committed == ["entries/c1/summaries/L3/final.md"]
    assert "A  unrelated.txt" in git(target, "status", "--short")  # not swept into our commit

    assert export_store(settings, target).commit is None  # nothing changed, no empty commit

    summarize_conversation(settings, "c1", config=SummarizerConfig(), force=True)
    second = export_store(settings, target)
    assert second.commit not in (None, first.commit)
    changed = git(target, "show", "--name-status", "--format=", "HEAD").split("\n")
    assert "A\tentries/c1/deleted/summaries/L3/final__g1.md" in changed
    assert "M\tentries/c1/summaries/L3/final.md" in changed
