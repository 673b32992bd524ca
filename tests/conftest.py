"""Shared pytest fixtures. The scripted OpenAI-compatible server lives in tests/openai_server.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_dag.config import Settings

pytest_plugins = ["tests.openai_server"]

#: The LoCoMo development conversations: `shared/` sits beside the repository checkout.
LOCOMO_DIR = next(
    (
        folder
        for folder in (
            Path(__file__).resolve().parents[2] / "shared" / "datasets" / "locomo-dev",
            Path("/work/shared/datasets/locomo-dev"),
        )
        if folder.is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "datasets" / "locomo-dev",
)


def write_jsonl(path: Path, records: list[dict | str]) -> Path:
    """Write transcript lines; a str is written as-is (for deliberately broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A small workspace: one note, one entry, two sessions of one conversation, one broken file."""
    root = tmp_path / "workspace"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(
        "# Durable notes\n\nThe deploy pipeline runs on Fridays.\n"
        "Staging lives at staging.example.org.\n",
        encoding="utf-8",
    )
    (root / "memory" / "garden.md").write_text(
        "# Garden\n\nTomatoes need watering every morning in July.\n", encoding="utf-8"
    )
    entry = root / "entries" / "trip" / "facts" / "f1.md"
    entry.parent.mkdir(parents=True)
    entry.write_text(
        "---\nid: fact-1\nrole: memory\ncreated_at: 2026-01-02T03:04:05Z\n---\n"
        "The user is planning a trip to Kyoto in April.\n",
        encoding="utf-8",
    )
    write_jsonl(
        root / "sessions" / "conv-a" / "s1.jsonl",
        [
            {
                "role": "user",
                "content": "I adopted a cat named Miso last week.",
                "id": "t1",
                "name": "Dana",
                "created_at": "2026-03-01T10:00:00Z",
            },
            {
                "type": "message",
                "message": {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Congratulations on adopting Miso!"}],
                },
            },
            {
                "role": "user",
                "content": "My sister Priya lives in Toronto.",
                "id": "t3",
                "name": "Dana",
            },
        ],
    )
    write_jsonl(
        root / "sessions" / "conv-a" / "s2.jsonl",
        [
            {
                "role": "user",
                "content": "Miso knocked over the basil plant.",
                "id": "u1",
                "name": "Dana",
            },
            '{"role": "user", "content": "this line is broken',
            {"role": "assistant", "content": "Maybe move the basil somewhere higher.", "id": "u3"},
        ],
    )
    write_jsonl(
        root / "sessions" / "conv-b" / "s9.jsonl",
        [{"role": "user", "content": "I prefer green tea over coffee.", "id": "x1"}],
    )
    return root


@pytest.fixture
def settings(tmp_path: Path, workspace: Path) -> Settings:
    return Settings(
        workspace=workspace,
        db_path=tmp_path / "store" / "memory.duckdb",
        index_dir=tmp_path / "store" / "index",
    )


@pytest.fixture(autouse=True)
def no_defs_state_storage_left_behind() -> Iterator[None]:
    """Each test starts without the Dagster instance another test entered last.

    Dagster keeps the entered instance's definitions-state storage in a context variable, and an
    instance entered while a sensor is evaluated is never left: definitions loaded by the next
    test then read that instance's deleted SQLite file ("unable to open database file").
    """
    from dagster._core.storage.defs_state.base import _current_storage

    token = _current_storage.set(None)
    yield
    _current_storage.reset(token)
