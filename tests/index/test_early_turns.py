"""The turns of a new session file are searchable after the chunks stage, before the index
step (`index/early_turns.py`), through the delta segment every reader lays over the published
version; once a version indexes them, they are found once."""

from __future__ import annotations

import pytest

from memory_dag.config import Settings
from memory_dag.index.delta import delta_path
from memory_dag.index.published import current_version
from memory_dag.index.search import search
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.pipeline import run_all
from tests.conftest import write_jsonl


def new_session(settings: Settings) -> None:
    write_jsonl(
        settings.workspace / "sessions" / "conv-a" / "s3.jsonl",
        [
            {"role": "user", "content": "My zebra finch Pico sings at dawn.", "id": "z1"},
            {"role": "assistant", "content": "Pico sounds like an early riser.", "id": "z2"},
        ],
    )


def pico(settings: Settings, conversation: str) -> list[str]:
    hits = search("zebra finch Pico", settings=settings, k=10, min_score=0.0,
                  conversation=conversation)  # fmt: skip
    return [hit.id for hit in hits if "Pico" in hit.snippet]


def test_new_turns_are_searchable_after_the_chunks_stage_within_their_scope(
    settings: Settings,
) -> None:
    run_all(settings)
    version = current_version(settings.index_dir)
    new_session(settings)

    sync_files(settings)
    report = build_chunks(settings)

    assert report.counts["turns_searchable_early"] == 2
    assert current_version(settings.index_dir) == version  # no index step yet
    early = pico(settings, "conv-a")
    assert len(early) == 2
    assert pico(settings, "conv-b") == []
    run_all(settings)  # the index step publishes them: found once, under the same ids
    assert current_version(settings.index_dir) != version
    assert sorted(pico(settings, "conv-a")) == sorted(early)


def test_turns_of_a_file_deleted_after_it_was_laid_are_gone_with_the_next_version(
    settings: Settings,
) -> None:
    """The version the next run publishes says what is true of the file: deleted, its laid
    turns must not come back from the delta (readers skip them; compaction drops them)."""
    run_all(settings)
    new_session(settings)
    sync_files(settings)
    assert build_chunks(settings).counts["turns_searchable_early"] == 2
    assert len(pico(settings, "conv-a")) == 2

    (settings.workspace / "sessions" / "conv-a" / "s3.jsonl").unlink()
    run_all(settings)

    assert pico(settings, "conv-a") == []


def test_only_over_a_published_version_and_a_changed_file_shows_each_turn_once(
    settings: Settings,
) -> None:
    sync_files(settings)
    assert build_chunks(settings).counts["turns_searchable_early"] == 0  # nothing published
    assert not delta_path(settings.index_dir).exists()
    run_all(settings)
    path = settings.workspace / "sessions" / "conv-a" / "s1.jsonl"
    path.write_text(path.read_text() + '{"role": "user", "content": "Pico?", "id": "t9"}\n')
    sync_files(settings)

    assert build_chunks(settings).counts["turns_searchable_early"] == 4  # the file's turns

    # Readers skip the turns their version holds: the new one shows, the old ones once.
    hits = search("Miso Pico adopted", settings=settings, k=10, min_score=0.0,
                  conversation="conv-a")  # fmt: skip
    snippets = [hit.snippet for hit in hits]
    assert any("Pico?" in snippet for snippet in snippets)
    assert len(snippets) == len(set(snippets))


def test_a_large_import_waits_for_the_index_step(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_dag.index import early_turns

    run_all(settings)
    monkeypatch.setattr(early_turns, "MAX_TURNS", 1)
    new_session(settings)  # two turns: over the limit
    sync_files(settings)

    assert build_chunks(settings).counts["turns_searchable_early"] == 0
    assert pico(settings, "conv-a") == []
    run_all(settings)
    assert len(pico(settings, "conv-a")) == 2


def test_turns_a_version_holds_are_compacted_away(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without live writes nothing else shortens the delta file: laying turns compacts it as
    a live writer does (here at once: every threshold at its minimum)."""
    import json

    from memory_dag.index import delta
    from memory_dag.memories import live_writer

    monkeypatch.setattr(live_writer, "COMPACT_BYTES", 0)
    monkeypatch.setattr(delta, "COMPACT_AFTER", 1)
    run_all(settings)
    new_session(settings)
    run_all(settings)  # laid, then published: the version holds them
    write_jsonl(
        settings.workspace / "sessions" / "conv-b" / "s4.jsonl",
        [{"role": "user", "content": "The heron came back to the pond.", "id": "h1"}],
    )
    sync_files(settings)
    assert build_chunks(settings).counts["turns_searchable_early"] == 1

    lines = delta_path(settings.index_dir).read_text().splitlines()
    paths = [json.loads(line)["memory"].get("path") for line in lines]
    assert paths == ["sessions/conv-b/s4.jsonl"]
    assert pico(settings, "conv-a")  # the compacted turns are in the version
