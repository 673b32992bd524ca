"""Work shared by worker processes gives the store that one process gives.

Reading the files, fact rules, entity extraction and extractive summaries of many items run
in worker processes (`memory_dag/parallel.py`), and the summaries stage reads, summarizes and
writes groups of conversations (`refresh.GROUP_TURNS`). A store built that way is compared,
table by table (`tests/store_snapshot.py`), with one built in this process alone, in one group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_dag import parallel
from memory_dag.config import Settings
from memory_dag.embed.onnx_models import usable_cpus
from memory_dag.ingest import files
from memory_dag.ingest.sources import discover_files
from memory_dag.pipeline import run_all
from memory_dag.store.connection import open_store
from memory_dag.summaries import refresh
from tests.scale.corpus import write_corpus
from tests.store_snapshot import differences


def build(root: Path, workspace: Path) -> Settings:
    settings = Settings(workspace=workspace, db_path=root / "memory.duckdb")
    run_all(settings, include_open=True)
    return settings


@pytest.mark.skipif(usable_cpus() < 2, reason="one core: nothing runs in worker processes")
def test_workers_and_groups_build_the_store_one_process_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "workspace"
    # 2,448 user turns (the rules run in workers from 2,000) in 48 conversations.
    write_corpus(workspace, users=48, sessions=3, turns=34)

    with monkeypatch.context() as patched:
        patched.setattr(refresh, "GROUP_TURNS", 1_000)  # 5 groups of ~10 conversations
        patched.setattr(files, "READ_IN_WORKERS_MIN_FILES", 10)  # 144 files, in workers
        shared = build(tmp_path / "shared", workspace)
    with monkeypatch.context() as patched:
        patched.setattr(parallel, "usable_cpus", lambda: 1)
        patched.setattr(refresh, "GROUP_TURNS", 10**9)
        one_at_a_time = build(tmp_path / "one_at_a_time", workspace)

    with open_store(shared.db_path, read_only=True) as con:
        facts, summaries = con.execute(
            "SELECT count(*) FILTER (kind = 'fact'), count(*) FILTER (kind = 'summary') "
            "FROM memories"
        ).fetchone()
    assert facts >= 40 and summaries >= 48  # the comparison below compares something
    assert differences(shared.db_path, one_at_a_time.db_path) == {}


@pytest.mark.skipif(usable_cpus() < 2, reason="one core: nothing runs in worker processes")
def test_files_read_by_workers_are_the_files_read_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker hands back its slice's turns as one table, cut again per file here: every
    file gets its own turns, errors and fingerprint, bad files and notes included."""
    workspace = tmp_path / "workspace"
    write_corpus(workspace, users=4, sessions=2, turns=5)
    lines = [
        json.dumps({"role": "user", "content": "first", "id": "odd:2"}),
        json.dumps({"role": "user", "content": "second"}),  # its line id is odd:2 too
        "{not json",
    ]
    (workspace / "sessions" / "odd.jsonl").write_text("\n".join(lines) + "\n")
    (workspace / "sessions" / "empty.jsonl").write_text("")
    (workspace / "memory").mkdir(exist_ok=True)
    (workspace / "memory" / "dated.md").write_text("---\nupdated: 2024-13-45\n---\nBody\n")
    found = discover_files(workspace)
    assert len(found) >= 12  # several slices a worker, transcripts and notes between them

    with monkeypatch.context() as patched:
        patched.setattr(files, "READ_IN_WORKERS_MIN_FILES", 1)
        shared = files.read_files(found)
    here = files.read_files(found)

    assert [read.parsed for read in shared] == [read.parsed for read in here]
    assert [read.episodes for read in shared] == [read.episodes for read in here]
    odd = next(read for read in here if read.file.rel_path == "sessions/odd.jsonl")
    assert odd.episodes is not None and odd.episodes["turn_id"].to_pylist() == ["odd:2", "odd:2~2"]
    assert [error.line for error in odd.errors] == [3, 2]  # the broken line, the id collision
