"""The FAISS index built from a staged `vectors.npy` is the one built from the matrix itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memory_dag.index.faiss_import import faiss
from memory_dag.index.vector_index import EXACT_MAX_VECTORS, build_faiss, build_faiss_from_file


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
