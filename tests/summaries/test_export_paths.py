"""Ids used as path parts: checked on the way in (remember, front matter), confined on the way
out (export never writes or removes outside its target folder)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.ids import path_part_problem
from memory_dag.ingest.files import sync_files
from memory_dag.memories import agent_ops
from memory_dag.memories.writer import MemoryOpError
from memory_dag.scope import Scope
from memory_dag.store.connection import open_store
from memory_dag.summaries.export import export_store
from tests.summaries.test_conversation_summaries import add_fact, settings_in

HOSTILE_IDS = ["../../../escaped", "/tmp/absolute", "a/../../b", "a//b", ".", "tab\there", ""]


@pytest.mark.parametrize("conversation_id", HOSTILE_IDS)
def test_hostile_ids_cannot_name_a_folder(conversation_id: str) -> None:
    assert path_part_problem(conversation_id) is not None


@pytest.mark.parametrize("conversation_id", ["demo", "conv-26", "a/b", "user:42", "Zoë"])
def test_ordinary_ids_can(conversation_id: str) -> None:
    assert path_part_problem(conversation_id) is None


def test_remember_refuses_a_conversation_id_that_cannot_be_a_folder(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)

    with pytest.raises(MemoryOpError, match="'..' path part"):
        agent_ops.remember(
            settings, "Sam likes tea.", scope=Scope.of(conversation_id="../../../escaped")
        )


def test_front_matter_conversation_id_that_cannot_be_a_folder_is_ignored(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    entry = settings.workspace / "entries" / "trip" / "facts" / "f1.md"
    entry.parent.mkdir(parents=True)
    entry.write_text("---\nconversation_id: ../../../escaped\n---\nSam likes tea.\n")

    sync_files(settings)

    with open_store(settings.db_path, read_only=True) as con:
        [(conversation,)] = con.execute("SELECT conversation_id FROM notes").fetchall()
        [(reason,)] = con.execute("SELECT reason FROM ingest_errors").fetchall()
    assert conversation == "trip"  # the folder's id, not the front matter's
    assert reason.startswith("conversation_id '../../../escaped' has an empty, '.' or '..'")


def _legacy_fact(settings: Settings, conversation_id: str) -> None:
    """A row stored before ids were checked."""
    sync_files(settings)
    add_fact(
        settings, conversation_id, "fact-1", "Sam likes tea.", datetime(2025, 1, 1, tzinfo=UTC)
    )


@pytest.mark.parametrize("conversation_id", ["../../../escaped", "/tmp/absolute-escape"])
def test_export_refuses_a_stored_id_that_would_leave_the_target(
    tmp_path: Path, conversation_id: str
) -> None:
    settings = settings_in(tmp_path / "a" / "b" / "c")
    _legacy_fact(settings, conversation_id)
    target = tmp_path / "a" / "b" / "c" / "out"
    before = sorted(str(p) for p in tmp_path.rglob("*"))

    report = export_store(settings, target, conversations=[conversation_id], facts=True)

    assert report.written == [] and report.conversations == []
    assert report.refused and report.refused[0].startswith(repr(conversation_id))
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert not Path("/tmp/absolute-escape").exists()


def test_export_command_says_what_it_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_in(tmp_path)
    _legacy_fact(settings, "../../escaped")
    db = ["--db", str(settings.db_path), "--workspace", str(settings.workspace)]

    out = str(tmp_path / "out")
    code = main(["export", out, "--conversation", "../../escaped", "--facts", "--no-commit", *db])

    assert code == 1
    assert "memory-dag: refused conversation '../../escaped'" in capsys.readouterr().err
    assert not (tmp_path.parent / "escaped").exists()


def test_export_never_writes_through_a_symlink_out_of_the_target(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    _legacy_fact(settings, "c1")
    target = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "entries" / "c1").mkdir(parents=True)
    os.symlink(elsewhere, target / "entries" / "c1" / "facts")

    with pytest.raises(ValueError, match="would be written outside"):
        export_store(settings, target, conversations=["c1"], facts=True, commit=False)

    assert list(elsewhere.iterdir()) == []
