"""A rebuild's BM25 index is made by a thread that `stage_rows` starts, beside the vectors'
fetch: what it publishes must equal the build made in line, and a discarded version must
leave nothing behind, even while that thread still runs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memory_dag.index import published
from memory_dag.index.published import (
    ROW_SCHEMA,
    discard_staged,
    publish_staged,
    stage_rows,
    stage_vectors,
)

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "hiking",
    "Paris",
    "coffee",
    "sister",
    "guitar",
    "moved",
    "bought",
    "likes",
]


def _rows(count: int) -> pa.Table:
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(_WORDS, size=int(rng.integers(3, 12)))) for _ in range(count)]
    return pa.Table.from_pylist(
        [
            {"id": f"r{i}", "kind": "transcript", "text": text, "search_text": text}
            for i, text in enumerate(texts)
        ],
        schema=ROW_SCHEMA,
    )


def _publish(index_dir: Path, rows: pa.Table) -> Path:
    staged = stage_rows(index_dir, rows.to_reader(), hashes=False)
    stage_vectors(staged, np.random.default_rng(1).random((rows.num_rows, 8), dtype=np.float32))
    manifest = publish_staged(index_dir, staged, provider="p", model="m", fingerprint="f")
    return index_dir / manifest["version"]


def test_the_threads_bm25_is_the_one_built_after_the_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(3_000)
    threaded = _publish(tmp_path / "threaded", rows)
    # Above the limit (for memory) no thread starts: `publish_staged` builds it beside FAISS.
    monkeypatch.setattr(published, "BM25_BESIDE_FETCH_MAX_ROWS", 2_999)
    assert stage_rows(tmp_path / "probe", rows.to_reader(), hashes=False).bm25 is None
    after = _publish(tmp_path / "after", rows)
    assert (threaded / "bm25" / "vocab.json").read_text() == (
        after / "bm25" / "vocab.json"
    ).read_text()
    for name in ("indptr.npy", "docs.npy", "weights.npy"):
        assert np.array_equal(np.load(threaded / "bm25" / name), np.load(after / "bm25" / name))
    for version in (threaded, after):
        assert '"bm25_avg_length"' in (version / "manifest.json").read_text()


def test_a_discarded_version_leaves_nothing_while_its_bm25_build_runs(tmp_path: Path) -> None:
    staged = stage_rows(tmp_path, _rows(60_000).to_reader(), hashes=False)
    assert staged.bm25 is not None
    discard_staged(staged)  # at once: the thread is still tokenizing
    assert staged.bm25.done()
    time.sleep(0.2)  # a thread left running would make `bm25/` (and its folder) again
    assert not staged.staging.exists()
    assert [p.name for p in tmp_path.iterdir()] == []
