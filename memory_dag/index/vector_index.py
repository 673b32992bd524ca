"""The FAISS vector index: exact for small collections, IVF (approximate) for large ones.

Vectors are L2-normalised, so inner product = cosine similarity. Up to `EXACT_MAX_VECTORS`
an exact `IndexFlatIP` is both fast enough and perfect; above it an `IndexIVFFlat` with
2·√n lists keeps a 100k-chunk query around a millisecond while finding ~0.9 of the exact
top results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memory_dag.index.faiss_import import faiss

#: The switch point between the exact and the approximate index (see docs/architecture.md).
EXACT_MAX_VECTORS = 50_000
#: IVF lists per square root of the vector count, lists probed per square root of the lists,
#: and the k-means training (points per list, iterations). The build's work grows with the
#: lists (k-means: their square); a query scans probes x n/lists vectors, ~1.8·n^¾ here: 10%
#: of 100k vectors, 5.6% of 1M, where the same share found more of the exact top results.
#: Measured with the LoCoMo questions, recall of the exact top 24 (`benchmarks/ivf_training.py`;
#: `benchmarks/results/ivf_lists_2026-11-29.txt`), against the earlier 4·√n lists (16 points a
#: list, 1/12 probed):
#: - 100k vectors: build 1.13-1.19 → 0.59-0.80 s, recall 0.875 → 0.875, 0.93 → 0.92-1.05 ms;
#: - 1M: build 20.1-21.4 → 9.2-9.8 s, recall 0.936 → 0.911, 9.6-10.5 → 6.8 ms a query
#:   (probing a tenth of the lists there: 0.940, 11.4 ms).
#: (Earlier, at 4·√n: FAISS's default training of 40 points and 25 iterations built in 4.2 s
#: at 100k for the same recall as 16 points and 10 iterations in 1.0 s.)
IVF_LISTS_PER_ROOT = 2
IVF_PROBES_PER_ROOT = 2.5
IVF_TRAIN_POINTS_PER_LIST = 32
IVF_TRAIN_ITERATIONS = 10


def index_type_for(count: int) -> str:
    return "flat" if count <= EXACT_MAX_VECTORS else "ivf"


def ivf_lists(count: int) -> int:
    """How many IVF lists an index of `count` vectors gets."""
    return max(1, int(IVF_LISTS_PER_ROOT * math.sqrt(count)))


def ivf_probes(lists: int, count: int) -> int:
    """How many of its `lists` lists a query probes in an index of `count` vectors.

    2.5·√lists for an index of `ivf_lists(count)` lists. An index with more lists (built
    before this rule: 4·√n) probes proportionally more of them, so that a query scans the
    same share of the vectors whatever the shape it was built with."""
    usual = ivf_lists(count)
    probes = IVF_PROBES_PER_ROOT * math.sqrt(usual) * lists / usual
    return min(lists, max(8, round(probes)))


def build_faiss(vectors: np.ndarray) -> faiss.Index:
    """Build the index for `vectors` (float32, rows normalised); row i gets FAISS id i."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    count, dims = vectors.shape
    return _build(count, dims, lambda rows: vectors[rows], lambda start, end: vectors[start:end])


#: Vectors read from a file and added to the index at a time, at least.
ADD_BLOCK = 65_536


def _add_blocks(count: int) -> list[tuple[int, int]]:
    """(start, end) of the blocks to add, such that FAISS assigns every vector to its list
    with exactly the arithmetic of one add of them all: each block is large enough for its
    BLAS path (when the whole is) and starts on one of that path's query blocks."""
    query_block = faiss.cvar.distance_compute_blas_query_bs
    size = max(ADD_BLOCK, faiss.cvar.distance_compute_blas_threshold)
    size = -(-size // query_block) * query_block
    starts = list(range(0, count, size))
    if not starts:
        return []
    if len(starts) > 1 and count - starts[-1] < size:  # a short last block joins the one before
        starts.pop()
    return list(zip(starts, [*starts[1:], count], strict=True))


def build_faiss_from_file(path: Path) -> faiss.Index:
    """`build_faiss(np.load(path))`, the same index, with the vectors of the `.npy` file read a
    block at a time by plain reads (not a memory map, whose pages count as the process's):
    only the index's own copy of the vectors is held (~1 GB less at 1M vectors of 256)."""
    mapped = np.load(path, mmap_mode="r")
    count, dims = mapped.shape
    offset, dtype = mapped.offset, mapped.dtype
    del mapped
    if dtype != np.float32:
        raise ValueError(f"{path}: {dtype} vectors, not float32")

    def sample(rows: np.ndarray) -> np.ndarray:
        picked = np.load(path, mmap_mode="r")[rows]  # a copy, in the order of `rows`
        return np.ascontiguousarray(picked, dtype=np.float32)

    def block(start: int, end: int) -> np.ndarray:
        values = np.fromfile(
            path, dtype=np.float32, count=(end - start) * dims, offset=offset + start * dims * 4
        )
        return values.reshape(end - start, dims)

    return _build(count, dims, sample, block)


def _build(
    count: int,
    dims: int,
    sample: Callable[[np.ndarray], np.ndarray],
    block: Callable[[int, int], np.ndarray],
) -> faiss.Index:
    """The index of `count` vectors given by `sample(rows)` (rows in that order) and
    `block(start, end)`, added in `ADD_BLOCK`s (as FAISS's IVF adds a large batch anyway)."""
    if index_type_for(count) == "flat":
        index = faiss.IndexFlatIP(dims)
    else:
        lists = ivf_lists(count)
        quantizer = faiss.IndexFlatIP(dims)
        index = faiss.IndexIVFFlat(quantizer, dims, lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = IVF_TRAIN_ITERATIONS
        index.cp.min_points_per_centroid = 1  # else FAISS warns on stderr below 39 points a list
        rng = np.random.default_rng(0)
        sample_size = min(count, lists * IVF_TRAIN_POINTS_PER_LIST)
        index.train(sample(rng.choice(count, size=sample_size, replace=False)))
        index.nprobe = ivf_probes(lists, count)
    for start, end in _add_blocks(count):
        index.add(block(start, end))
    return index


def save_faiss(index: faiss.Index, path: Path) -> None:
    faiss.write_index(index, str(path))


def load_faiss(path: Path) -> faiss.Index:
    index = faiss.read_index(str(path))
    if isinstance(index, faiss.IndexIVF):
        index.nprobe = ivf_probes(index.nlist, index.ntotal)
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
