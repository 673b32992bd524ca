"""FAISS IVF at 100k (or `--size`) vectors: build time and recall against the exact index.

    python benchmarks/ivf_training.py [--size 100000] [--k 24] [--sweeps lists,training,probes]

Embeds `--size` generated turns (the corpus of `ingest_search.py`: LoCoMo sentences
recombined, 60-120 tokens) and the LoCoMo questions with the default WordLlama model, then
reports build time and recall@k of the exact top k (single-threaded queries, as the search
path runs them), in three sweeps (`--sweeps`): numbers of lists (c·√n) with training sizes
and shares probed; (training points per list, k-means iterations) with the index's own
lists; and nprobe, as a share of the lists and as a multiple of their square root.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

from memory_dag.index.faiss_import import faiss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_search import LOCOMO_DIR, load_locomo, make_turn_texts  # noqa: E402

from memory_dag.embed.providers import WordLlamaProvider  # noqa: E402
from memory_dag.index.vector_index import (  # noqa: E402
    IVF_LISTS_PER_ROOT,
    IVF_TRAIN_ITERATIONS,
    IVF_TRAIN_POINTS_PER_LIST,
    ivf_lists,
    ivf_probes,
)


def build_ivf(
    vectors: np.ndarray, per_list: int, iterations: int, lists_factor: float = IVF_LISTS_PER_ROOT
) -> faiss.IndexIVFFlat:
    """The IVF index as `vector_index` builds it, with these training settings and
    `lists_factor`·√n lists (probed as `vector_index` probes them)."""
    count, dims = vectors.shape
    lists = int(lists_factor * math.sqrt(count))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dims), dims, lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = iterations
    index.cp.min_points_per_centroid = 1
    sample = np.random.default_rng(0).choice(
        count, size=min(count, lists * per_list), replace=False
    )
    index.train(vectors[sample])
    index.add(vectors)
    index.nprobe = ivf_probes(lists, count)
    return index


def recall(
    index: faiss.Index, queries: np.ndarray, truth: np.ndarray, k: int
) -> tuple[float, float]:
    """(mean recall@k of the exact top k, ms per single query)."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    found = []
    start = time.perf_counter()
    for query in queries:
        found.append(index.search(query.reshape(1, -1), k)[1][0])
    ms = (time.perf_counter() - start) / len(queries) * 1000
    faiss.omp_set_num_threads(threads)
    hits = [len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(truth, found, strict=True)]
    return float(np.mean(hits)), ms


def lists_sweep(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, k: int) -> None:
    """Build time, recall and query time with c·√n lists, p training points a list (10
    iterations) and a share of the lists probed (the share of the vectors scanned), twice each."""
    print("lists sweep: c·√n lists, p training points a list, 10 iterations")
    header = f"  {'c':>4} {'p':>3} {'probed':>7} {'lists':>6} {'nprobe':>6} {'build s':>8}"
    print(f"{header} {'recall':>7} {'ms/query':>9}")
    settings = [(4.0, 16, 12), (2.0, 16, 12), (2.0, 32, 12), (2.0, 32, 10), (2.0, 16, 10)]
    for _round in range(2):
        for factor, per_list, share in settings:
            start = time.perf_counter()
            index = build_ivf(vectors, per_list, 10, factor)
            seconds = time.perf_counter() - start
            index.nprobe = max(8, int(index.nlist / share))
            found, ms = recall(index, queries, truth, k)
            print(
                f"  {factor:>4} {per_list:>3} {'1/' + str(share):>7} {index.nlist:>6} "
                f"{index.nprobe:>6} {seconds:8.2f} {found:7.3f} {ms:9.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--k", type=int, default=24)
    parser.add_argument(
        "--sweeps",
        default="lists,training,probes",
        help="which sweeps, comma-separated: lists (c·√n lists), training, probes (nprobe)",
    )
    args = parser.parse_args()
    sweeps = set(args.sweeps.split(","))

    sentences, _pairs, questions = load_locomo(LOCOMO_DIR)
    provider = WordLlamaProvider()
    texts = make_turn_texts(sentences, args.size, random.Random(0))
    vectors = provider.embed(texts)
    queries = provider.embed([q["q"] for q in questions])
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    truth = exact.search(queries, args.k)[1]
    lists = ivf_lists(args.size)
    print(
        f"{args.size:,} vectors, {lists} lists, nprobe {ivf_probes(lists, args.size)}, "
        f"{len(queries)} LoCoMo questions, recall@{args.k} of the exact top {args.k}"
    )
    if "lists" in sweeps:
        lists_sweep(vectors, queries, truth, args.k)
    if "training" in sweeps:
        training_sweep(vectors, queries, truth, args.k)
    if "probes" in sweeps:
        probes_sweep(vectors, queries, truth, args.k)
    found, ms = recall(exact, queries, truth, args.k)
    print(f"  exact flat scan: recall {found:.3f}, {ms:.3f} ms a query")


def training_sweep(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, k: int) -> None:
    """Build time and recall per (training points a list, k-means iterations), the index's own
    lists and probes."""
    print(f"  {'points/list':>11} {'iterations':>10} {'build s':>8} {'recall':>7} {'ms/query':>9}")
    for per_list, iterations in [(40, 25), (40, 10), (32, 10), (16, 25), (16, 10), (8, 10)]:
        start = time.perf_counter()
        index = build_ivf(vectors, per_list, iterations)
        seconds = time.perf_counter() - start
        found, ms = recall(index, queries, truth, k)
        print(f"  {per_list:>11} {iterations:>10} {seconds:8.2f} {found:7.3f} {ms:9.3f}")


def probes_sweep(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, k: int) -> None:
    """Recall and query time per nprobe, the index as `vector_index` builds it."""
    index = build_ivf(vectors, IVF_TRAIN_POINTS_PER_LIST, IVF_TRAIN_ITERATIONS)
    lists = index.nlist
    training = f"{IVF_TRAIN_POINTS_PER_LIST} points a list, {IVF_TRAIN_ITERATIONS} iterations"
    print(f"nprobe sweep ({lists} lists, {training})")
    root = math.sqrt(lists)
    candidates = [lists // 24, lists // 12, lists // 10, lists // 8, lists // 5]
    candidates += [int(c * root) for c in (1.5, 2, 2.5, 3, 4)]
    for nprobe in sorted(set(candidates)):
        index.nprobe = nprobe
        found, ms = recall(index, queries, truth, k)
        print(
            f"  nprobe {nprobe:>4} ({nprobe / root:.2f}·√lists): "
            f"recall {found:.3f}, {ms:.3f} ms a query"
        )


if __name__ == "__main__":
    main()
