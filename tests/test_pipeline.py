"""The ingest pipeline over a real DuckDB file and a real index folder: incremental, idempotent,
loses nothing on bad input, and leaves the last good index readable after a crash."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.index import build
from memory_dag.index import published as index_files
from memory_dag.index.build import build_indexes, build_search_index
from memory_dag.index.published import current_version, load_index
from memory_dag.index.search import search
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.pipeline import run_all
from memory_dag.store.connection import open_store
from tests.conftest import write_jsonl


def counts(settings: Settings, sql: str) -> list[tuple]:
    with open_store(settings.db_path, read_only=True) as con:
        return con.execute(sql).fetchall()


def test_first_run_fills_every_table(settings: Settings) -> None:
    reports = {r.stage: r for r in run_all(settings)}

    assert reports["files"].counts["new"] == 6
    assert reports["files"].counts["episodes_written"] == 6  # 7 lines, one broken
    files = dict(counts(settings, "SELECT path, kind FROM files"))
    assert files["MEMORY.md"] == "note"
    assert files["entries/trip/facts/f1.md"] == "entry"
    assert files["sessions/conv-a/s1.jsonl"] == "transcript"
    episodes = counts(
        settings,
        "SELECT turn_id, role, speaker, session_id, conversation_id, line FROM episodes "
        "WHERE session_id = 's1' ORDER BY line",
    )
    assert episodes == [
        ("t1", "user", "Dana", "s1", "conv-a", 1),
        ("s1:2", "assistant", None, "s1", "conv-a", 2),
        ("t3", "user", "Dana", "s1", "conv-a", 3),
    ]
    entry = counts(
        settings,
        "SELECT entry_id, role, conversation_id, created_at FROM notes WHERE kind = 'entry'",
    )
    assert entry[0][:3] == ("fact-1", "memory", "trip")
    assert entry[0][3].year == 2026
    # The whole graph: the closed session's facts, and entities of turns and facts.
    assert reports["facts"].counts["facts_added"] >= 1
    assert reports["entities"].counts["entities"] >= 1
    assert counts(settings, "SELECT count(*) FROM facts")[0][0] >= 1
    # Every chunk and derived memory is embedded with the recorded dimensions and indexed.
    (documents,) = counts(settings, "SELECT count(*) FROM search_documents")[0]
    (chunk_count,) = counts(settings, "SELECT count(*) FROM chunks")[0]
    manifest = index_files.read_manifest(settings.index_dir)
    assert manifest["count"] == documents > chunk_count
    assert manifest["dims"] == 256
    assert counts(settings, "SELECT value FROM store_meta WHERE key = 'embedding_dims'") == [
        ("256",)
    ]


def test_bad_line_is_recorded_and_the_rest_of_the_file_ingested(settings: Settings) -> None:
    run_all(settings)
    errors = counts(settings, "SELECT path, line, reason FROM ingest_errors")
    assert len(errors) == 1
    assert errors[0][:2] == ("sessions/conv-a/s2.jsonl", 2)
    assert "JSON" in errors[0][2]
    turns = counts(settings, "SELECT turn_id FROM episodes WHERE session_id = 's2' ORDER BY line")
    assert turns == [("u1",), ("u3",)]


def test_second_run_changes_nothing(settings: Settings) -> None:
    run_all(settings)
    before = counts(settings, "SELECT id, hash FROM chunks ORDER BY id")
    version = current_version(settings.index_dir)

    reports = {r.stage: r for r in run_all(settings)}

    assert reports["files"].counts["new"] == 0
    assert reports["files"].counts["changed"] == 0
    assert reports["files"].counts["unchanged"] == 6
    assert list(reports) == ["files"]  # the graph settled: the later stages are not run
    # Each later stage, run anyway, finds nothing to do.
    assert build_chunks(settings).counts["written"] == 0
    assert embed_chunks(settings).counts["embedded"] == 0
    assert all(report.skipped for report in build_indexes(settings))
    assert counts(settings, "SELECT id, hash FROM chunks ORDER BY id") == before
    assert current_version(settings.index_dir) == version


def test_both_indexes_are_built_side_by_side(settings: Settings) -> None:
    """The FTS build runs in a second thread beside the FAISS + BM25 build, on one store."""
    sync_files(settings)
    build_chunks(settings)
    embed_chunks(settings)

    built = list(build_indexes(settings))

    assert [r.stage for r in built] == ["search_index", "chunks_fts"]
    assert built[1].counts["beside_search_index"] == 1  # benchmarks count the longer one
    assert current_version(settings.index_dir) is not None
    matches = counts_fts(settings, "Priya")
    assert matches and all(score > 0 for _, score in matches)
    # Each can be asked for alone; unchanged indexes are not rebuilt.
    assert [r.stage for r in build_indexes(settings, search_index=False)] == ["chunks_fts"]
    assert [r.skipped for r in build_indexes(settings)] == [True, True]


def test_a_large_store_builds_its_fts_index_after_the_search_index(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above FTS_BESIDE_MAX_CHUNKS the builds take turns (memory), and the report says so:
    the step's library time is then the sum of both (benchmarks/whole_graph.py)."""
    sync_files(settings)
    build_chunks(settings)
    embed_chunks(settings)
    monkeypatch.setattr(build, "FTS_BESIDE_MAX_CHUNKS", 0)

    built = list(build_indexes(settings))

    assert [r.stage for r in built] == ["search_index", "chunks_fts"]
    assert built[1].counts["beside_search_index"] == 0
    assert counts_fts(settings, "Priya")


def test_a_failed_fts_build_still_publishes_the_search_index(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync_files(settings)
    build_chunks(settings)
    embed_chunks(settings)

    def broken_fts(settings: Settings, *, force: bool = False, background: bool = False) -> None:
        raise RuntimeError("no FTS extension here")

    monkeypatch.setattr(build, "build_fts_index", broken_fts)
    builds = build_indexes(settings)

    assert next(builds).stage == "search_index"  # reported before the FTS error surfaces
    with pytest.raises(RuntimeError, match="no FTS extension"):
        next(builds)
    assert search("Priya", settings=settings, k=1, min_score=0.0)[0].turn_ids == ["t3"]


def counts_fts(settings: Settings, query: str) -> list[tuple]:
    from memory_dag.store.connection import load_fts

    with open_store(settings.db_path) as con:
        load_fts(con)
        return con.execute(
            "SELECT id, fts_main_chunks.match_bm25(id, ?) AS score FROM chunks "
            "WHERE score IS NOT NULL",
            [query],
        ).fetchall()


def test_touch_without_change_is_not_reingested(settings: Settings, workspace: Path) -> None:
    run_all(settings)
    note = workspace / "MEMORY.md"
    later = time.time() + 5
    os.utime(note, (later, later))
    report = sync_files(settings)
    assert report.counts["changed"] == 0
    assert report.counts["unchanged"] == 6
    assert counts(settings, "SELECT mtime FROM files WHERE path = 'MEMORY.md'")[0][0] == later


def test_changed_file_replaces_its_rows(settings: Settings, workspace: Path) -> None:
    run_all(settings)
    write_jsonl(
        workspace / "sessions" / "conv-a" / "s2.jsonl",
        [{"role": "user", "content": "Miso now sleeps on the bookshelf.", "id": "u9"}],
    )
    reports = {r.stage: r for r in run_all(settings)}

    assert reports["files"].counts["changed"] == 1
    assert counts(settings, "SELECT turn_id FROM episodes WHERE session_id = 's2'") == [("u9",)]
    # The broken line's error went with the old version of the file.
    assert counts(settings, "SELECT count(*) FROM ingest_errors") == [(0,)]
    texts = [t for (t,) in counts(settings, "SELECT text FROM chunks WHERE session_id = 's2'")]
    assert texts == ["Dana: Miso now sleeps on the bookshelf."] or texts == [
        "User: Miso now sleeps on the bookshelf."
    ]
    hits = search("bookshelf", settings=settings, min_score=0.0, k=1)
    assert hits[0].turn_ids == ["u9"]


def test_deleted_file_leaves_no_rows_and_no_search_hits(
    settings: Settings, workspace: Path
) -> None:
    run_all(settings)
    (workspace / "memory" / "garden.md").unlink()
    (workspace / "sessions" / "conv-b" / "s9.jsonl").unlink()

    reports = {r.stage: r for r in run_all(settings)}

    assert reports["files"].counts["deleted"] == 2
    for table in ("files", "chunks", "notes"):
        rows = counts(
            settings,
            f"SELECT count(*) FROM {table} WHERE path IN "
            "('memory/garden.md', 'sessions/conv-b/s9.jsonl')",
        )
        assert rows == [(0,)], table
    assert counts(settings, "SELECT count(*) FROM episodes WHERE session_id = 's9'") == [(0,)]
    hits = search("tomatoes watering July", settings=settings, min_score=0.0, k=10)
    assert all(h.path != "memory/garden.md" for h in hits)


def test_identical_text_is_embedded_once(settings: Settings, workspace: Path) -> None:
    (workspace / "memory" / "copy.md").write_text(
        (workspace / "memory" / "garden.md").read_text(), encoding="utf-8"
    )
    sync_files(settings)
    build_chunks(settings)
    report = embed_chunks(settings)
    (chunks, distinct) = counts(settings, "SELECT count(*), count(DISTINCT hash) FROM chunks")[0]
    assert chunks == distinct + 1
    assert report.counts["embedded"] == distinct
    assert report.counts["cached"] == distinct


def test_failed_index_build_keeps_the_last_good_version(
    settings: Settings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_all(settings)
    good = current_version(settings.index_dir)
    (workspace / "memory" / "new.md").write_text("Pinecones are scattered on the path.\n")
    sync_files(settings)
    build_chunks(settings)
    embed_chunks(settings)

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(index_files, "save_faiss", crash)
    with pytest.raises(OSError, match="disk full"):
        build_search_index(settings)

    assert current_version(settings.index_dir) == good
    assert not list(settings.index_dir.glob(".tmp-*"))
    index = load_index(settings.index_dir)
    assert "memory/new.md" not in index.rows["path"]
    monkeypatch.undo()
    build_search_index(settings)
    assert "memory/new.md" in load_index(settings.index_dir).rows["path"]


def test_unreadable_and_binary_files_are_recorded(settings: Settings, workspace: Path) -> None:
    (workspace / "memory" / "photo.md").write_bytes(b"\x89PNG\x00\x00binary")
    (workspace / "memory" / "latin1.md").write_bytes("caf\xe9 notes".encode("latin-1"))
    (workspace / "memory" / "empty.md").write_text("")
    run_all(settings)
    reasons = dict(counts(settings, "SELECT path, reason FROM ingest_errors"))
    assert "binary" in reasons["memory/photo.md"]
    assert "UTF-8" in reasons["memory/latin1.md"]
    assert "empty" in reasons["memory/empty.md"]
    # The good files are all there.
    assert counts(settings, "SELECT count(*) FROM chunks WHERE path = 'MEMORY.md'")[0][0] >= 1


def test_chunks_commit_a_group_of_files_at_a_time_and_a_cut_run_resumes(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that fails in its second group keeps the first group's chunks, marked done; the
    next run chunks the rest, and the store equals one chunked in a single run."""
    from memory_dag.ingest import chunks as chunk_stage

    sync_files(settings)
    reference = settings.model_copy(update={"db_path": tmp_path / "reference.duckdb"})
    shutil.copy(settings.db_path, reference.db_path)
    build_chunks(reference)

    monkeypatch.setattr(chunk_stage, "CHUNK_FILES_BATCH", 2)
    chunk_rows = chunk_stage._chunk_rows
    groups: list[int] = []

    def second_group_fails(group, *args):  # noqa: ANN001, ANN202
        groups.append(len(group))
        if len(groups) == 2:  # made while the first group is written
            raise RuntimeError("the process dies in the second group")
        return chunk_rows(group, *args)

    monkeypatch.setattr(chunk_stage, "_chunk_rows", second_group_fails)
    with pytest.raises(RuntimeError, match="second group"):
        build_chunks(settings)
    done = counts(settings, "SELECT path FROM files WHERE chunked_hash = hash ORDER BY path")
    assert len(done) == 2  # the first group, committed
    chunked = counts(settings, "SELECT DISTINCT path FROM chunks ORDER BY path")
    assert set(chunked) <= set(done) and chunked

    monkeypatch.setattr(chunk_stage, "_chunk_rows", chunk_rows)
    rest = build_chunks(settings)
    assert rest.counts["files_chunked"] == len(counts(settings, "SELECT path FROM files")) - 2
    columns = "id, path, start_line, end_line, hash, text, search_text, tokens, turn_ids"
    query = f"SELECT {columns} FROM chunks ORDER BY id"
    assert counts(settings, query) == counts(reference, query)
