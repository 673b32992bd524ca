"""The FAISS vector index: exact for small collections, IVF (approximate) for large ones.

Vectors are L2-normalised, so inner product = cosine similarity. Up to `EXACT_MAX_VECTORS`
an exact `IndexFlatIP` is both fast enough and perfect; above it an `IndexIVFFlat` with
~4·√n lists keeps a 100k-chunk query under a millisecond while finding ~0.9 of the exact
top results.
"""

from __future__ import annotations

import math
from pathlib import Path

import faiss
import numpy as np

#: The switch point between the exact and the approximate index (see docs/architecture.md).
EXACT_MAX_VECTORS = 50_000
#: Fraction of IVF lists probed per query, and the k-means training (points per list,
#: iterations). Measured at 100k vectors with the LoCoMo questions
#: (`benchmarks/ivf_training.py`): FAISS's default training (40 points, 25 iterations) with
#: 1/16 probed builds in 4.2 s and finds 0.87 of the exact top 24 in 0.5 ms; 16 points and
#: 10 iterations with 1/12 probed builds in 1.0 s and finds 0.88 in 0.7 ms (1/8: 0.91 in
#: 1.0 ms, which costs the unscoped search p50 about 1 ms of its 5 ms budget).
IVF_PROBE_FRACTION = 1 / 12
IVF_TRAIN_POINTS_PER_LIST = 16
IVF_TRAIN_ITERATIONS = 10


def index_type_for(count: int) -> str:
    return "flat" if count <= EXACT_MAX_VECTORS else "ivf"


def build_faiss(vectors: np.ndarray) -> faiss.Index:
    """Build the index for `vectors` (float32, rows normalised); row i gets FAISS id i."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    count, dims = vectors.shape
    if index_type_for(count) == "flat":
        index = faiss.IndexFlatIP(dims)
        index.add(vectors)
        return index
    lists = int(4 * math.sqrt(count))
    quantizer = faiss.IndexFlatIP(dims)
    index = faiss.IndexIVFFlat(quantizer, dims, lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = IVF_TRAIN_ITERATIONS
    index.cp.min_points_per_centroid = 1  # else FAISS warns on stderr below 39 points a list
    rng = np.random.default_rng(0)
    sample_size = min(count, lists * IVF_TRAIN_POINTS_PER_LIST)
    sample = vectors[rng.choice(count, size=sample_size, replace=False)]
    index.train(sample)
    index.add(vectors)
    index.nprobe = max(8, int(lists * IVF_PROBE_FRACTION))
    return index


def save_faiss(index: faiss.Index, path: Path) -> None:
    faiss.write_index(index, str(path))


def load_faiss(path: Path) -> faiss.Index:
    index = faiss.read_index(str(path))
    if isinstance(index, faiss.IndexIVF):
        index.nprobe = max(8, int(index.nlist * IVF_PROBE_FRACTION))
    return index


def search_faiss(index: faiss.Index, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cosine scores) of the `k` nearest rows; rows of -1 (not found) are dropped."""
    if index.ntotal == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    # One query gains nothing from OpenMP threads, and on a busy machine they spin-wait.
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        scores, rows = index.search(query.reshape(1, -1).astype(np.float32), min(k, index.ntotal))
    finally:
        faiss.omp_set_num_threads(threads)
    keep = rows[0] >= 0
    return rows[0][keep], scores[0][keep]
