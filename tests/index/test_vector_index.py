"""The FAISS index built from a staged `vectors.npy` is the one built from the matrix itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memory_dag.index.faiss_import import faiss
from memory_dag.index.vector_index import (
    EXACT_MAX_VECTORS,
    build_faiss,
    build_faiss_from_file,
    ivf_lists,
    ivf_probes,
    load_faiss,
    save_faiss,
)


# 270k vectors: added in two blocks (`_add_blocks`), against one add of them all.
@pytest.mark.parametrize("count", [0, 7, 1_000, EXACT_MAX_VECTORS + 5_003, 270_001])
def test_index_from_the_file_is_byte_identical(tmp_path: Path, count: int) -> None:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((count, 16)).astype(np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
    path = tmp_path / "vectors.npy"
    np.save(path, vectors)
    from_matrix = faiss.serialize_index(build_faiss(vectors))
    from_file = faiss.serialize_index(build_faiss_from_file(path))
    assert np.array_equal(from_matrix, from_file)


def test_an_ivf_index_finds_what_the_exact_scan_finds(tmp_path: Path) -> None:
    """Above `EXACT_MAX_VECTORS` the index is approximate: its lists and probes must still
    find nearly all of the exact top 10 (0.98 here), when built and when loaded back."""
    rng = np.random.default_rng(5)
    count, dims = EXACT_MAX_VECTORS + 10_000, 32
    centres = rng.standard_normal((400, dims)).astype(np.float32)
    vectors = centres[rng.integers(0, len(centres), count)]
    vectors += rng.standard_normal((count, dims)).astype(np.float32)  # clusters that overlap
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[rng.choice(count, 200, replace=False)] + 0.1 * rng.standard_normal(
        (200, dims)
    ).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = faiss.IndexFlatIP(dims)
    exact.add(vectors)
    truth = exact.search(queries, 10)[1]

    built = build_faiss(vectors)
    save_faiss(built, tmp_path / "vectors.faiss")
    for index in (built, load_faiss(tmp_path / "vectors.faiss")):
        ivf = faiss.extract_index_ivf(index)
        assert ivf.nlist == ivf_lists(count) and ivf.nprobe == ivf_probes(ivf.nlist, count)
        found = index.search(queries, 10)[1]
        hits = [len(set(a) & set(b)) for a, b in zip(truth.tolist(), found.tolist(), strict=True)]
        assert sum(hits) / truth.size >= 0.95  # 8 lists probed: 0.87, 1: 0.59


def test_an_index_with_more_lists_probes_the_same_share_of_its_vectors() -> None:
    """An index built with 4·√n lists (before the 2·√n rule) scans what a new one scans."""
    for count in (60_000, 100_000, 1_000_000):
        lists = ivf_lists(count)
        new_share = ivf_probes(lists, count) / lists
        old_share = ivf_probes(2 * lists, count) / (2 * lists)
        assert abs(old_share - new_share) <= 1 / lists
