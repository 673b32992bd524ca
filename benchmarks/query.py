"""memory.query latency (bullets) on generated stores of 10k, 100k and 1M memories.

    python benchmarks/query.py [--sizes 10000,100000,1000000] [--queries 300] [--keep DIR]

For each size N it generates N fact memories (1,000 per user, so N/1000 users; one
conversation per user; categories cycling through the supervisor's and planner's allowlists;
1-3 LoCoMo sentences each; event times over the last year; ~1 `related_to` edge per memory),
writes them to a DuckDB store (`memories`, `relations`) and publishes a search index for them
directly with `index_files.publish_index` (vectors = normalised sums of the WordLlama vectors
of the sentences, as WordLlama's average pooling would give; no pipeline run). Then, warm, it
times `query_tool.query_memory` end to end (search, store signals, stages, access log,
bullets, 512-token budget) for LoCoMo questions:

    user       bound to one user (the usual case: the index filter keeps that user's rows)
    index only bound user, store signals off (what the DuckDB look-up costs)

A call bound to no user is refused on these stores (they hold memories of many users:
`memory_dag/scope.py` fails closed), so there is no unbound case to time.

and prints p50 / p95 / mean in ms. Seed 003 §6 targets < 150 ms for bullets.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.index.published import publish_index
from memory_dag.read.query import MemoryQuery, query_memory
from memory_dag.read.retriever import RetrievalConfig, Retriever
from memory_dag.scope import Scope
from memory_dag.store.connection import insert_arrow, open_store

LOCOMO_DIR = Path("/work/shared/datasets/locomo-dev")
PER_USER = 1_000
CATEGORIES = ["profile", "goals", "preferences", "event", "activity", "relationships", "tasks",
              "projects"]  # fmt: skip
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")
NOW = datetime(2026, 11, 1, tzinfo=UTC)


def load_locomo(data_dir: Path) -> tuple[list[str], list[str]]:
    """(sentences of the turns, questions) of the LoCoMo dev conversations."""
    sentences: list[str] = []
    asked: list[str] = []
    for name in sorted(glob.glob(str(data_dir / "*.json"))):
        data = json.loads(Path(name).read_text())
        conversation = data.get("conversation", data)
        for key, value in conversation.items():
            if re.fullmatch(r"session_\d+", key) and isinstance(value, list):
                for turn in value:
                    sentences += [
                        s for s in SENTENCE_SPLIT.split(turn.get("text", "")) if len(s) > 3
                    ]
        asked += [qa["question"] for qa in data.get("qa", []) if qa.get("question")]
    return sentences, asked


def generate(size: int, sentences: list[str], sentence_vectors: np.ndarray, seed: int):
    """(rows for the index, vectors) of `size` fact memories."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(sentences), size=(size, 3))
    lengths = rng.integers(1, 4, size=size)
    vectors = np.zeros((size, sentence_vectors.shape[1]), dtype=np.float32)
    for width in (1, 2, 3):
        rows = np.flatnonzero(lengths >= width)
        vectors[rows] += sentence_vectors[picks[rows, width - 1]]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [" ".join(sentences[i] for i in picks[r, : lengths[r]]) for r in range(size)]
    users = [f"user{r // PER_USER:04d}" for r in range(size)]
    ages = rng.uniform(0, 365, size=size)
    times = [NOW - timedelta(days=float(a)) for a in ages]
    rows = pa.table(
        {
            "id": [f"fact_{r:08d}" for r in range(size)],
            "kind": ["fact"] * size,
            "source": ["memories"] * size,
            "path": [""] * size,
            "start_line": [0] * size,
            "end_line": [0] * size,
            "text": texts,
            "search_text": texts,
            "conversation_id": [f"conv-{u}" for u in users],
            "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
            "category": [CATEGORIES[r % len(CATEGORIES)] for r in range(size)],
            "user_id": users,
            "importance": pa.array(rng.integers(1, 6, size=size), pa.int32()),
            "pinned": [False] * size,
            "updated_at": pa.array(times, pa.timestamp("us", tz="UTC")),
        }
    )
    return rows, vectors


def write_store(db_path: Path, rows: pa.Table, seed: int) -> None:
    """`memories` for the rows and ~1 related_to edge per memory, within each user."""
    size = rows.num_rows
    rng = np.random.default_rng(seed + 1)
    memories = pa.table(
        {
            "id": rows["id"],
            "kind": rows["kind"],
            "content": rows["text"],
            "conversation_id": rows["conversation_id"],
            "user_id": rows["user_id"],
            "category": rows["category"],
            "importance": rows["importance"],
            "event_time": rows["event_time"],
            "created_at": rows["updated_at"],
        }
    )
    sources = np.arange(size)
    targets = (sources // PER_USER) * PER_USER + rng.integers(0, PER_USER, size=size)
    keep = (targets != sources) & (targets < size)
    ids = rows["id"].to_numpy(zero_copy_only=False)
    relations = pa.table(
        {
            "id": [f"rel_{i:08d}" for i in range(int(keep.sum()))],
            "from_id": ids[sources[keep]],
            "to_id": ids[targets[keep]],
            "strength": rng.uniform(0.7, 1.0, size=int(keep.sum())),
        }
    )
    with open_store(db_path) as con:
        insert_arrow(con, "memories", memories)
        insert_arrow(con, "relations", relations)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench(size: int, root: Path, sentences, vectors_of, asked, queries: int, seed: int) -> None:
    started = time.perf_counter()
    rows, vectors = generate(size, sentences, vectors_of, seed)
    index_dir, db_path = root / "index", root / "memory.duckdb"
    write_store(db_path, rows, seed)
    provider = get_provider(Settings())
    manifest = publish_index(
        index_dir, rows, vectors, provider=provider.name, model=provider.model,
        fingerprint=f"benchmark-{size}-{seed}",
    )  # fmt: skip
    del rows, vectors
    gc.collect()
    built = time.perf_counter() - started
    settings = Settings(index_dir=index_dir, db_path=db_path, workspace=root / "workspace")
    load_started = time.perf_counter()
    retrievers = {
        "user": Retriever(settings),
        "index only": Retriever(settings, RetrievalConfig(store_signals=False)),
    }
    warm_up = MemoryQuery(agent="planner", query="warm up", top_k=5)
    for retriever in retrievers.values():  # loads the index, the store snapshot, the model
        query_memory(
            warm_up, scope=Scope.of(user_id="user0000"), settings=settings, retriever=retriever
        )
    loaded = time.perf_counter() - load_started
    users = size // PER_USER
    rng = random.Random(seed)
    picked = [rng.choice(asked) for _ in range(queries)]
    print(
        f"\n=== {size:,} memories, {users:,} users: generated + store + index built in "
        f"{built:.1f}s (faiss {manifest['faiss_type']}); first queries (index load, store "
        f"snapshot) {loaded:.1f}s"
    )
    print(f"  {'scope':<11}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}{'results':>9}")
    for name, retriever in retrievers.items():
        timings: list[float] = []
        counts: list[int] = []
        for number, question in enumerate(picked):
            request = MemoryQuery(
                agent="supervisor" if number % 2 else "planner",
                query=question,
                top_k=5,
                budget_tokens=512,
            )
            user = f"user{rng.randrange(users):04d}"
            begin = time.perf_counter()
            response = query_memory(
                request, scope=Scope.of(user_id=user), settings=settings, retriever=retriever
            )
            timings.append((time.perf_counter() - begin) * 1000)
            counts.append(len(response.results))
        print(
            f"  {name:<11}{statistics.median(timings):>9.1f}{percentile(timings, 0.95):>9.1f}"
            f"{statistics.fmean(timings):>9.1f}{statistics.fmean(counts):>9.1f}"
        )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", help="keep the generated stores under this folder")
    args = parser.parse_args()
    sentences, asked = load_locomo(LOCOMO_DIR)
    provider = get_provider(Settings())
    sentence_vectors = provider.embed(sentences)
    print(
        f"memory.query benchmark {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"{len(sentences):,} LoCoMo sentences, {len(asked):,} questions; "
        f"{provider.name}/{provider.model}; load average at start "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    for size in [int(s) for s in args.sizes.split(",")]:
        root = Path(args.keep) / str(size) if args.keep else Path(tempfile.mkdtemp())
        root.mkdir(parents=True, exist_ok=True)
        try:
            bench(size, root, sentences, sentence_vectors, asked, args.queries, args.seed)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
