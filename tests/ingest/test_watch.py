"""What the workspace scan reports (`memory_dag/ingest/watch.py`), and what it has to read."""

from __future__ import annotations

from pathlib import Path

from memory_dag.ingest.sources import hash_bytes
from memory_dag.ingest.watch import scan_workspace


def _workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    (workspace / "sessions" / "c1").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("Known note.\n")
    (workspace / "sessions" / "c1" / "s1.jsonl").write_text('{"role": "user", "content": "hi"}\n')
    return workspace


def test_a_scan_for_changes_only_does_not_read_new_files(tmp_path: Path) -> None:
    """A file the previous state does not know is new whatever it holds: `hash_new=False`
    (the CLI's check before a run) leaves it unread; the sensors' state keeps every hash."""
    workspace = _workspace(tmp_path)
    known, _ = scan_workspace(workspace, {}, debounce_seconds=0)
    assert known.new == ["MEMORY.md", "sessions/c1/s1.jsonl"]
    _, state = scan_workspace(workspace, {}, debounce_seconds=0)
    note = workspace / "MEMORY.md"
    assert state["MEMORY.md"][2] == hash_bytes(note.read_bytes())

    previous = {"MEMORY.md": state["MEMORY.md"]}
    note.write_text("Changed note, same file.\n")
    changes, unread = scan_workspace(workspace, previous, debounce_seconds=0, hash_new=False)

    assert (changes.new, changes.changed) == (["sessions/c1/s1.jsonl"], ["MEMORY.md"])
    assert unread["sessions/c1/s1.jsonl"][2] is None  # new: not read
    assert unread["MEMORY.md"][2] == hash_bytes(note.read_bytes())  # known: read to compare
