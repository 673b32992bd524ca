"""Incremental index versions (`index/incremental.py`) on a real store and real FAISS files:
the next version made from the live one answers as a rebuild of the same rows would (same rows,
same hits under scope filters), is published atomically, and gives way to a rebuild when the
change is large or the chain is long."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from memory_dag.config import Settings
from memory_dag.index import incremental
from memory_dag.index.build import build_search_index
from memory_dag.index.published import current_version, load_index, read_manifest
from memory_dag.index.search import search
from memory_dag.index.text_index import TextIndex
from memory_dag.pipeline import run_all
from tests.conftest import write_jsonl


@pytest.fixture
def small_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test store has ~20 rows: any change is a large share of it."""
    monkeypatch.setattr(incremental, "SMALL_CHANGE", 1.0)


def new_session(settings: Settings) -> None:
    write_jsonl(
        settings.workspace / "sessions" / "conv-a" / "s3.jsonl",
        [
            {"role": "user", "content": "My zebra finch Pico sings at dawn.", "id": "z1"},
            {"role": "assistant", "content": "Pico sounds like an early riser.", "id": "z2"},
        ],
    )


def rebuilt(settings: Settings, tmp_path: Path) -> Settings:
    """The same store's index, rebuilt from scratch into another folder."""
    other = settings.model_copy(update={"index_dir": tmp_path / "rebuilt-index"})
    build_search_index(other, force=True)
    return other


def rows(settings: Settings) -> pl.DataFrame:
    folder = settings.index_dir / str(current_version(settings.index_dir))
    return pl.read_parquet(folder / "rows.parquet").drop("updated_at")


def hits(settings: Settings, query: str, conversation: str | None = None) -> list[str]:
    found = search(query, settings=settings, k=5, min_score=0.0, conversation=conversation)
    return [hit.id for hit in found]


def test_a_new_session_is_added_to_the_live_version_and_answers_as_a_rebuild(
    settings: Settings, tmp_path: Path, small_changes: None
) -> None:
    run_all(settings)
    base = read_manifest(settings.index_dir)
    assert base is not None and "incremental" not in base
    new_session(settings)

    reports = {r.stage: r for r in run_all(settings)}

    manifest = read_manifest(settings.index_dir)
    assert manifest is not None
    assert reports["search_index"].counts["incremental"] == 1
    assert manifest["incremental"]["base"] == base["version"]
    assert manifest["incremental"]["added"] >= 2  # the two turns (and the facts, summary)
    assert manifest["increments"] == 1
    full = rebuilt(settings, tmp_path)
    # The same rows (appended ones last), the same vectors per row.
    by_id = rows(settings).sort("id")
    assert by_id.equals(rows(full).sort("id"))
    mine, theirs = load_index(settings.index_dir), load_index(full.index_dir)
    order = [theirs.row_of(row_id) for row_id in mine.rows["id"]]
    assert np.allclose(mine.vectors, theirs.vectors[order])
    assert mine.faiss_index.ntotal == theirs.faiss_index.ntotal == mine.size
    # The new turns are found, within their conversation only, as in the rebuild.
    assert (
        hits(settings, "zebra finch Pico", "conv-a")[0]
        == hits(full, "zebra finch Pico", "conv-a")[0]
    )
    assert "Pico" in search("zebra finch Pico", settings=settings, k=1, min_score=0.0,
                            conversation="conv-a")[0].snippet  # fmt: skip
    assert not any(
        "Pico" in hit.snippet
        for hit in search("zebra finch Pico", settings=settings, k=5, conversation="conv-b")
    )
    for query, conversation in [("Miso basil", "conv-a"), ("green tea", "conv-b"), ("Kyoto", None)]:
        assert set(hits(settings, query, conversation)) == set(hits(full, query, conversation))


def test_bm25_postings_match_a_rebuild_but_for_the_mean_length(
    settings: Settings, tmp_path: Path, small_changes: None
) -> None:
    run_all(settings)
    new_session(settings)
    run_all(settings)
    mine = load_index(settings.index_dir)
    theirs = load_index(rebuilt(settings, tmp_path).index_dir)
    for term in ("pico", "miso", "tea", "kyoto"):
        assert mine.text.document_frequency(term) == theirs.text.document_frequency(term), term
    order = [theirs.row_of(row_id) for row_id in mine.rows["id"]]
    for query in ("zebra finch Pico", "Miso basil plant"):
        mine_scores, their_scores = mine.text.scores(query), theirs.text.scores(query)[order]
        assert np.array_equal(mine_scores > 0, their_scores > 0)
        # Only the length normalisation differs (the live version's mean length is kept).
        assert np.allclose(mine_scores, their_scores, rtol=0.1)


def test_a_changed_file_is_put_back_whole_in_line_order(
    settings: Settings, small_changes: None
) -> None:
    run_all(settings)
    path = settings.workspace / "sessions" / "conv-a" / "s1.jsonl"
    path.write_text(
        path.read_text() + json.dumps({"role": "user", "content": "Miso is 2.", "id": "t9"}) + "\n"
    )

    run_all(settings)

    index = load_index(settings.index_dir)
    assert read_manifest(settings.index_dir)["increments"] == 1
    rows_of_file = [r for r, p in enumerate(index.rows["path"]) if p == "sessions/conv-a/s1.jsonl"]
    rows_of_file = [r for r in rows_of_file if index.rows["kind"][r] == "transcript"]
    assert rows_of_file == list(range(rows_of_file[0], rows_of_file[0] + len(rows_of_file)))
    lines = [index.rows["start_line"][r] for r in rows_of_file]
    assert lines == sorted(lines) and len(lines) == 4
    assert index.next_row[rows_of_file[0]] == rows_of_file[1]  # neighbours still link


def test_a_large_change_or_a_long_chain_rebuilds(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_all(settings)
    new_session(settings)
    run_all(settings)  # default threshold: two new turns are far over 5% of ~20 rows
    assert "incremental" not in read_manifest(settings.index_dir)

    monkeypatch.setattr(incremental, "SMALL_CHANGE", 1.0)
    monkeypatch.setattr(incremental, "MAX_INCREMENTS", 1)
    (settings.workspace / "sessions" / "conv-a" / "s3.jsonl").unlink()
    run_all(settings)
    assert read_manifest(settings.index_dir)["increments"] == 1
    new_session(settings)
    run_all(settings)
    assert "incremental" not in read_manifest(settings.index_dir)  # rebuilt after 1 in a row


def test_a_failed_incremental_build_leaves_the_live_version(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, small_changes: None
) -> None:
    run_all(settings)
    live = current_version(settings.index_dir)
    new_session(settings)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(incremental.TextIndex, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        run_all(settings)

    assert current_version(settings.index_dir) == live
    assert not list(settings.index_dir.glob(".tmp-*"))
    assert hits(settings, "Miso basil", "conv-a")
    monkeypatch.undo()
    monkeypatch.setattr(incremental, "SMALL_CHANGE", 1.0)
    run_all(settings)  # the next run finishes the job
    assert "Pico" in search("zebra finch Pico", settings=settings, k=1, min_score=0.0,
                            conversation="conv-a")[0].snippet  # fmt: skip


def test_ivf_lists_take_the_change_without_training_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, small_changes: None
) -> None:
    from memory_dag.index import vector_index
    from memory_dag.index.faiss_import import faiss

    monkeypatch.setattr(vector_index, "EXACT_MAX_VECTORS", 5)  # IVF from 6 rows on
    write_jsonl(  # IVF trains 2 * sqrt(rows) lists: it needs at least as many rows
        settings.workspace / "sessions" / "conv-b" / "s8.jsonl",
        [{"role": "user", "content": f"Note {n}: the {n}th bird flew by.", "id": f"b{n}"}
         for n in range(40)],
    )  # fmt: skip
    run_all(settings)
    base = load_index(settings.index_dir)
    assert base.manifest["faiss_type"] == "ivf"
    new_session(settings)
    (settings.workspace / "memory" / "garden.md").unlink()  # rows go too

    run_all(settings)

    index = load_index(settings.index_dir)
    assert index.manifest["faiss_type"] == "ivf" and index.manifest["increments"] == 1
    assert index.manifest["incremental"]["removed"] >= 1
    ivf = faiss.extract_index_ivf(index.faiss_index)
    held = [
        int(i)
        for number in range(ivf.nlist)
        for i in faiss.rev_swig_ptr(ivf.invlists.get_ids(number), ivf.invlists.list_size(number))
    ]
    assert sorted(held) == list(range(index.size))  # every row once, under its new number
    ivf.nprobe = ivf.nlist  # every list: each row's vector finds itself (or an equal one)
    scores, found = index.faiss_index.search(index.vectors, 1)
    assert np.allclose(scores.ravel(), (index.vectors * index.vectors).sum(axis=1), atol=1e-5)
    assert np.allclose(index.vectors[found.ravel()], index.vectors, atol=1e-5)
    assert "Pico" in search("zebra finch Pico", settings=settings, k=1, min_score=0.0,
                            conversation="conv-a")[0].snippet  # fmt: skip


def test_a_maintenance_republish_rebuilds(settings: Settings, small_changes: None) -> None:
    """The nightly jobs republish through `refresh_index`: a rebuild, not one more increment."""
    from memory_dag.maintenance.common import refresh_index
    from memory_dag.reports import StageReport

    run_all(settings)
    new_session(settings)
    run_all(settings)
    assert read_manifest(settings.index_dir)["increments"] == 1
    (settings.workspace / "sessions" / "conv-a" / "s3.jsonl").unlink()
    sync_files_and_chunks(settings)

    refresh_index(settings, StageReport("decay"))

    manifest = read_manifest(settings.index_dir)
    assert "incremental" not in manifest and "increments" not in manifest


def sync_files_and_chunks(settings: Settings) -> None:
    from memory_dag.ingest.chunks import build_chunks
    from memory_dag.ingest.files import sync_files

    sync_files(settings)
    build_chunks(settings)


def _postings_built_plainly(
    old: TextIndex,
    keep: np.ndarray,
    vocab_size: int,
    new: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    added_rows: int,
) -> sp.csr_matrix:
    """What `merged_postings` replaced: every posting's term, a mask, COO → CSR, a sort."""
    new_terms, new_docs, tf, norm = new
    old_df = np.diff(old.indptr)
    term_of = np.repeat(np.arange(len(old_df)), old_df)
    kept_entry = keep[old.docs]
    kept_terms, kept_docs = term_of[kept_entry], (np.cumsum(keep) - 1)[old.docs[kept_entry]]
    size = int(keep.sum()) + added_rows
    df = np.bincount(kept_terms, minlength=vocab_size) + np.bincount(
        new_terms, minlength=vocab_size
    )
    idf = np.log1p((size - df + 0.5) / (df + 0.5)).astype(np.float32)
    old_idf = np.log1p((len(keep) - old_df + 0.5) / (old_df + 0.5)).astype(np.float32)
    kept_weights = old.weights[kept_entry] * (idf[: len(old_df)] / old_idf)[kept_terms]
    new_weights = idf[new_terms] * tf / (tf + norm)
    matrix = sp.csr_matrix(
        (
            np.concatenate([kept_weights, new_weights]).astype(np.float32),
            (
                np.concatenate([kept_terms, new_terms]),
                np.concatenate([kept_docs, new_docs + int(keep.sum())]),
            ),
        ),
        shape=(vocab_size, size),
    )
    matrix.sort_indices()
    return matrix


@pytest.mark.parametrize("removed", [0, 15])
def test_merged_postings_are_the_plain_build_bit_for_bit(removed: int) -> None:
    """The postings of an increment are merged run by run, without sorting all of them: the
    same matrix, to the bit, as building them plainly (rows removed or not, new terms)."""
    rng = np.random.default_rng(removed)
    rows, terms, new_rows, new_terms = 300, 50, 30, 10

    def pairs(n_terms: int, n_docs: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        flat = rng.choice(n_terms * n_docs, size=count, replace=False)
        return flat // n_docs, flat % n_docs

    term, doc = pairs(terms, rows, 2_000)
    old_matrix = sp.csr_matrix(
        (rng.random(len(term), dtype=np.float32), (term, doc)), shape=(terms, rows)
    )
    old_matrix.sort_indices()
    old = TextIndex(
        {f"t{i}": i for i in range(terms)},
        old_matrix.indptr.astype(np.int64),
        old_matrix.indices.astype(np.int32),
        old_matrix.data.astype(np.float32),
        rows,
        7.5,
    )
    keep = np.ones(rows, dtype=bool)
    keep[rng.choice(rows, size=removed, replace=False)] = False
    vocab = {**old.vocab, **{f"n{i}": terms + i for i in range(new_terms)}}
    term, doc = pairs(terms + new_terms, new_rows, 150)
    tf = rng.integers(1, 4, len(term)).astype(np.float32)
    norm = rng.random(len(term), dtype=np.float32) + np.float32(0.5)

    merged = incremental.merged_postings(old, keep, vocab, (term, doc, tf, norm), new_rows, 7.5)
    plain = _postings_built_plainly(old, keep, len(vocab), (term, doc, tf, norm), new_rows)

    assert merged.size == rows - removed + new_rows
    np.testing.assert_array_equal(merged.indptr, plain.indptr)
    np.testing.assert_array_equal(merged.docs, plain.indices)
    np.testing.assert_array_equal(merged.weights, plain.data)


@given(keep=st.lists(st.booleans(), max_size=300))
@hypothesis_settings(max_examples=200, deadline=None)
def test_kept_rows_are_copied_as_np_compress_copies_them(keep: list[bool]) -> None:
    mask = np.asarray(keep, dtype=bool)
    source = np.arange(len(mask) * 3, dtype=np.float32).reshape(len(mask), 3)
    out = np.full((int(mask.sum()), 3), -1.0, dtype=np.float32)
    incremental.copy_kept_rows(source, mask, out)
    assert np.array_equal(out, np.compress(mask, source, axis=0))


def test_kept_rows_are_read_from_the_live_file_in_place(tmp_path: Path) -> None:
    vectors = np.random.default_rng(1).random((1_000, 8), dtype=np.float32)
    np.save(tmp_path / "vectors.npy", vectors)
    live = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    keep = np.ones(1_000, dtype=bool)
    keep[[0, 17, 18, 500, 999]] = False
    out = np.empty((995, 8), dtype=np.float32)
    incremental.copy_kept_rows(live, keep, out)
    assert np.array_equal(out, vectors[keep])
    with pytest.raises(ValueError, match="output rows"):
        incremental.copy_kept_rows(live, keep, np.empty((996, 8), dtype=np.float32))
