"""Ingest throughput and warm hybrid-search latency on a generated corpus (embedded defaults).

    python benchmarks/ingest_search.py --sizes 10000,100000 [--queries 300] [--search-repeats 3]
        [--ingest-repeats 1] [--profile benchmarks/results/profiles] [--keep DIR] [--seed 0]

For every size N it generates a temporary workspace of session transcripts
(`sessions/<conversation>/<session>.jsonl`, ~20 conversations, 25 turns a session, one chunk per
turn) whose turns are 60-120 tokens recombined from the sentences of the LoCoMo dev turns (real
vocabulary, real participant names), then:

1. ingest: runs the real pipeline stages in one process, each timed on its own
   (sync_files -> build_chunks -> embed_chunks -> build_indexes, which builds the search index
   and DuckDB's FTS index side by side), on the default settings (WordLlama, no LLM); reports
   turns/s and chunks/s until the search index is published ("searchable") and until every
   stage is done ("end to end"). Then a second, incremental run with nothing changed. With
   --ingest-repeats R the cold ingest is repeated on fresh stores (same corpus) and medians
   are printed.
2. search: a warm `memory_dag.index.search.Searcher`; >= --queries queries (half LoCoMo
   questions with the names mapped onto the generated conversations, half turn prefixes),
   unscoped and scoped to one conversation (`SearchFilters(conversation=...)`), with fusion
   "blend" and "zscore".
   Each variant is timed --search-repeats times (interleaved); the median of each percentile
   over repeats is printed.

First it times WordLlama's own `embed` on 20k such turns: the machines of this kind vary by up
to ~1.8x from day to day, and the aims were set where that ran at ~5,500 texts/s, so the
ingest rates are also printed scaled to that speed.

--profile DIR writes pyinstrument text + HTML profiles of one cold ingest (per stage) and of
each search variant into DIR.
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
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.index.build import build_indexes
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.ingest.tokens import count_tokens_batch
from memory_dag.reports import StageReport

LOCOMO_DIR = Path("/work/shared/datasets/locomo-dev")
CONVERSATIONS = 20
TURNS_PER_SESSION = 25
MIN_TOKENS, MAX_TOKENS = 60, 120
STAGES = ("files", "chunks", "embeddings")  # then "indexes": search index + DuckDB FTS
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")


# --- corpus ----------------------------------------------------------------------------------


def load_locomo(data_dir: Path) -> tuple[list[str], list[tuple[str, str]], list[dict]]:
    """(sentences, speaker pairs, questions) from the LoCoMo dev conversations."""
    sentences: list[str] = []
    pairs: list[tuple[str, str]] = []
    questions: list[dict] = []
    for name in sorted(glob.glob(str(data_dir / "*.json"))):
        data = json.loads(Path(name).read_text())
        conv = data.get("conversation", data)
        a, b = conv["speaker_a"], conv["speaker_b"]
        pairs.append((a, b))
        for key, value in conv.items():
            if re.fullmatch(r"session_\d+", key) and isinstance(value, list):
                for turn in value:
                    for sentence in SENTENCE_SPLIT.split(turn.get("text", "")):
                        sentence = sentence.strip()
                        if len(sentence) > 3:
                            sentences.append(sentence)
        for qa in data.get("qa", []):
            if qa.get("category") in (1, 2, 3, 4) and qa.get("question"):
                questions.append({"q": qa["question"], "names": (a, b)})
    return sentences, pairs, questions


def names_for(pairs: list[tuple[str, str]], conversations: int) -> list[tuple[str, str]]:
    """Two participant names per generated conversation (LoCoMo's first, then recombined; when
    there are more conversations than ordered pairs of names, the pairs repeat)."""
    firsts = sorted({n for pair in pairs for n in pair})
    distinct = min(conversations, len(firsts) * (len(firsts) - 1))
    out = list(pairs)
    rng = random.Random(7)
    while len(out) < distinct:
        a, b = rng.sample(firsts, 2)
        if (a, b) not in out:
            out.append((a, b))
    return [out[i % len(out)] for i in range(conversations)]


def make_turn_texts(sentences: list[str], count: int, rng: random.Random) -> list[str]:
    """`count` turns of MIN..MAX tokens, each a recombination of LoCoMo sentences."""
    tokens = dict(zip(sentences, count_tokens_batch(sentences), strict=True))
    out: list[str] = []
    while len(out) < count:
        target = rng.randint(MIN_TOKENS, MAX_TOKENS)
        parts: list[str] = []
        total = 0
        while total < target:
            sentence = rng.choice(sentences)
            parts.append(sentence)
            total += tokens[sentence] + 1
        out.append(" ".join(parts))
    return out


#: What the issue's aims were set against: WordLlama's own `embed` of such chunks on this
#: machine kind ran at ~5,500 texts/s (../shared/notes/measured.md, 2026-11-22).
REFERENCE_WORDLLAMA_RATE = 5_500


def wordllama_rate(sentences: list[str], seed: int, texts: int = 20_000) -> float:
    """Texts/s of WordLlama's own `embed` (not memory-dag's) on generated turns: how fast this
    machine is today, next to the figure the aims were set against."""
    import wordllama

    model = wordllama.WordLlama.load(
        cache_dir=Path(wordllama.__file__).parent, disable_download=True
    )
    corpus = make_turn_texts(sentences, texts, random.Random(seed))
    model.embed(corpus[:1000])
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        model.embed(corpus)
        rates.append(len(corpus) / (time.perf_counter() - t0))
    return statistics.median(rates)


def write_corpus(
    workspace: Path,
    size: int,
    sentences,
    pairs,
    seed: int,
    *,
    conversations: int = CONVERSATIONS,
    turns_per_session: int = TURNS_PER_SESSION,
) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str]]]:
    """Write `size` turns as transcripts; returns (names per conversation, (conv, turn) sample)."""
    rng = random.Random(seed)
    texts = make_turn_texts(sentences, size, rng)
    names = names_for(pairs, conversations)
    per_conversation = [
        size // conversations + (i < size % conversations) for i in range(conversations)
    ]
    conv_names: dict[str, tuple[str, str]] = {}
    samples: list[tuple[str, str]] = []
    start = datetime(2023, 1, 1, 9, 0, tzinfo=UTC)
    taken = 0
    sample_rate = min(1.0, max(0.05, 2000 / max(size, 1)))  # turn prefixes for the queries
    for c, turns in enumerate(per_conversation):
        conversation = f"conv-{c:0{max(2, len(str(conversations - 1)))}d}"
        conv_names[conversation] = names[c]
        folder = workspace / "sessions" / conversation
        folder.mkdir(parents=True, exist_ok=True)
        for s, first in enumerate(range(0, turns, turns_per_session)):
            when = start + timedelta(days=3 * s, hours=c)
            lines = []
            for t in range(first, min(first + turns_per_session, turns)):
                speaker = names[c][t % 2]
                text = texts[taken]
                taken += 1
                lines.append(
                    json.dumps(
                        {
                            "type": "message",
                            "id": f"s{s}-t{t - first}",
                            "role": "user" if t % 2 == 0 else "assistant",
                            "name": speaker,
                            "content": text,
                            "created_at": (when + timedelta(minutes=t - first)).isoformat(),
                        }
                    )
                )
                if rng.random() < sample_rate:
                    samples.append((conversation, text))
            (folder / f"session-{s:04d}.jsonl").write_text("\n".join(lines) + "\n")
    return conv_names, samples


def make_queries(
    questions: list[dict],
    samples: list[tuple[str, str]],
    conv_names: dict[str, tuple[str, str]],
    count: int,
    rng: random.Random,
) -> list[tuple[str, str]]:
    """(query, conversation) pairs: LoCoMo questions (names mapped) and turn prefixes."""
    conversations = sorted(conv_names)
    out: list[tuple[str, str]] = []
    picked_q = rng.sample(questions, min(len(questions), count // 2))
    for qa in picked_q:
        conversation = rng.choice(conversations)
        query = qa["q"]
        for old, new in zip(qa["names"], conv_names[conversation], strict=True):
            query = re.sub(rf"\b{re.escape(old)}\b", new, query)
        out.append((query, conversation))
    for conversation, text in rng.sample(samples, min(len(samples), count - len(out))):
        words = text.split()
        out.append((" ".join(words[: rng.randint(6, 12)]), conversation))
    rng.shuffle(out)
    return out


# --- measurement -----------------------------------------------------------------------------


@contextmanager
def maybe_profile(profile_dir: Path | None, name: str):
    if profile_dir is None:
        yield
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        profile_dir.mkdir(parents=True, exist_ok=True)
        (profile_dir / f"{name}.txt").write_text(
            profiler.output_text(unicode=False, color=False, show_all=False)
        )
        (profile_dir / f"{name}.html").write_text(profiler.output_html())


def run_ingest(settings: Settings, profile_dir: Path | None, tag: str) -> dict[str, float]:
    """Every stage, timed with perf_counter around the stage call; returns seconds per stage.

    The two indexes are built side by side (`build_indexes`, as the pipeline does):
    "search_index" is when the search index was published, "indexes" when both were done.
    """
    times: dict[str, float] = {}
    counts: dict[str, dict] = {}
    stages = [
        ("files", sync_files),
        ("chunks", build_chunks),
        ("embeddings", embed_chunks),
        ("indexes", build_indexes),
    ]
    for name, stage in stages:
        gc.collect()
        with maybe_profile(profile_dir, f"{tag}-{name}"):
            t0 = time.perf_counter()
            reports = stage(settings)
            for report in [reports] if isinstance(reports, StageReport) else reports:
                times[report.stage] = time.perf_counter() - t0
                counts[report.stage] = dict(report.counts)
                if report.errors:
                    raise RuntimeError(f"{name}: {report.errors[:3]}")
            times[name] = time.perf_counter() - t0
    times["_counts"] = counts  # type: ignore[assignment]
    return times


def percentiles(values: list[float]) -> tuple[float, float, float]:
    arr = np.asarray(values) * 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 95)), float(arr.mean())


def fresh_settings(root: Path, workspace: Path, n: int) -> Settings:
    store = root / f"store-{n}"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    return Settings(workspace=workspace, db_path=store / "memory.duckdb", index_dir=store / "index")


def bench_size(size: int, args, sentences, pairs, questions) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"ingest-bench-{size}-", dir=args.tmp))
    try:
        workspace = root / "workspace"
        t0 = time.perf_counter()
        conv_names, samples = write_corpus(workspace, size, sentences, pairs, args.seed)
        files = sum(1 for _ in workspace.rglob("*.jsonl"))
        print(
            f"\n=== {size:,} turns: {CONVERSATIONS} conversations, {files:,} session files "
            f"({TURNS_PER_SESSION} turns each), {MIN_TOKENS}-{MAX_TOKENS} tokens a turn "
            f"(corpus written in {time.perf_counter() - t0:.1f}s) ==="
        )

        runs: list[dict[str, float]] = []
        settings = None
        for r in range(args.ingest_repeats):
            settings = fresh_settings(root, workspace, r)
            prof = args.profile / f"ingest-{size}" if (args.profile and r == 0) else None
            runs.append(run_ingest(settings, prof, "cold"))
        assert settings is not None
        counts = runs[-1]["_counts"]
        chunks = int(counts["chunks"]["chunks"])
        turns = int(counts["files"]["episodes_written"])
        if chunks != size or turns != size:
            print(f"  note: {turns} turns, {chunks} chunks (expected {size})")

        def med(stage: str) -> float:
            return statistics.median(run[stage] for run in runs)

        before_indexes = sum(med(s) for s in STAGES)
        searchable = before_indexes + med("search_index")
        end_to_end = before_indexes + med("indexes")
        totals = ", ".join(f"{sum(r[s] for s in (*STAGES, 'indexes')):.2f}s" for r in runs)
        print(
            f"ingest, cold ({len(runs)} run{'s' if len(runs) > 1 else ''}, median; "
            f"per-run totals: {totals})"
        )
        for stage in (*STAGES, "indexes"):
            per = ", ".join(f"{r[stage]:.2f}" for r in runs)
            share = med(stage) / end_to_end * 100
            print(f"  {stage:<13} {med(stage):8.2f} s  {share:5.1f}%   [{per}]")
        print(
            f"    (side by side: search index published after {med('search_index'):.2f} s, "
            f"DuckDB FTS done after {med('chunks_fts'):.2f} s)"
        )
        print(
            f"  {'searchable':<13} {searchable:8.2f} s  -> {turns / searchable:8,.0f} turns/s, "
            f"{chunks / searchable:8,.0f} chunks/s  (files .. search index published)"
        )
        print(
            f"  {'end to end':<13} {end_to_end:8.2f} s  -> {turns / end_to_end:8,.0f} turns/s, "
            f"{chunks / end_to_end:8,.0f} chunks/s  (every stage, DuckDB FTS included)"
        )
        print(
            f"  at the reference machine speed: searchable "
            f"{chunks / searchable / args.machine_speed:,.0f} chunks/s, end to end "
            f"{chunks / end_to_end / args.machine_speed:,.0f} chunks/s"
        )

        incremental = [
            run_ingest(settings, None, "incremental") for _ in range(max(2, args.ingest_repeats))
        ]
        inc_total = statistics.median(sum(r[s] for s in (*STAGES, "indexes")) for r in incremental)
        parts = ", ".join(
            f"{s} {statistics.median(r[s] for r in incremental):.2f}" for s in (*STAGES, "indexes")
        )
        print(
            f"ingest, incremental (nothing changed, median of {len(incremental)}): "
            f"{inc_total:.2f} s  [{parts}]"
        )

        # ---- search ------------------------------------------------------------------------
        from memory_dag.index.search import Searcher, SearchFilters

        t0 = time.perf_counter()
        searcher = Searcher(settings)
        searcher.search("warm up the model")
        load = time.perf_counter() - t0
        manifest = searcher.index.manifest
        rng = random.Random(args.seed + 1)
        queries = make_queries(questions, samples, conv_names, args.queries, rng)
        for query, conversation in queries[:20]:  # warm caches
            searcher.search(query)
            searcher.search(query, filters=SearchFilters(conversation=conversation))
        variants = [
            ("unscoped", "blend"),
            ("unscoped", "zscore"),
            ("conversation", "blend"),
            ("conversation", "zscore"),
        ]
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {v: [] for v in variants}
        hits_seen: dict[tuple[str, str], list[int]] = {v: [] for v in variants}
        for rep in range(args.search_repeats):
            order = variants if rep % 2 == 0 else list(reversed(variants))
            for scope, fusion in order:
                latencies = []
                for query, conversation in queries:
                    filters = (
                        SearchFilters(conversation=conversation)
                        if scope == "conversation"
                        else None
                    )
                    t = time.perf_counter()
                    hits = searcher.search(query, filters=filters, fusion=fusion)
                    latencies.append(time.perf_counter() - t)
                    if rep == 0:
                        hits_seen[(scope, fusion)].append(len(hits))
                results[(scope, fusion)].append(percentiles(latencies))
        print(
            f"search, warm ({len(queries)} queries x {args.search_repeats} repeats, median of "
            f"repeats; index {manifest['count']:,} rows, faiss {manifest['faiss_type']}, "
            f"load+first query {load:.2f}s)"
        )
        print(
            f"  {'scope':<13} {'fusion':<7} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8} {'hits':>5}"
        )
        for scope, fusion in variants:
            reps = results[(scope, fusion)]
            p50 = statistics.median(r[0] for r in reps)
            p95 = statistics.median(r[1] for r in reps)
            mean = statistics.median(r[2] for r in reps)
            avg_hits = float(np.mean(hits_seen[(scope, fusion)]))
            print(f"  {scope:<13} {fusion:<7} {p50:8.2f} {p95:8.2f} {mean:8.2f} {avg_hits:5.1f}")

        if args.profile:
            for scope, fusion in variants:
                with maybe_profile(args.profile / f"search-{size}", f"{scope}-{fusion}"):
                    for query, conversation in queries:
                        filters = (
                            SearchFilters(conversation=conversation)
                            if scope == "conversation"
                            else None
                        )
                        searcher.search(query, filters=filters, fusion=fusion)
        sys.stdout.flush()
    finally:
        if args.keep:
            print(f"(kept {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--search-repeats", type=int, default=3)
    parser.add_argument("--ingest-repeats", type=int, default=1)
    parser.add_argument(
        "--profile", type=Path, default=None, help="write pyinstrument profiles here"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary workspace and store"
    )
    parser.add_argument("--tmp", default=None, help="parent folder for the temporary workspace")
    parser.add_argument("--data", type=Path, default=LOCOMO_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import duckdb
    import wordllama

    from memory_dag.index.faiss_import import faiss

    print(
        f"memory-dag ingest/search benchmark  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  "
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, duckdb {duckdb.__version__}, "
        f"faiss {faiss.__version__}, wordllama {getattr(wordllama, '__version__', '?')}"
    )
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sentences, pairs, questions = load_locomo(args.data)
    print(
        f"LoCoMo: {len(sentences):,} sentences, {len(questions)} questions, "
        f"{len(pairs)} speaker pairs"
    )
    reference = wordllama_rate(sentences, args.seed)
    speed = reference / REFERENCE_WORDLLAMA_RATE
    print(
        f"machine speed: WordLlama's own embed runs at {reference:,.0f} texts/s "
        f"({speed:.2f}x the {REFERENCE_WORDLLAMA_RATE:,}/s the aims were set against)"
    )
    args.machine_speed = speed
    for size in (int(s) for s in args.sizes.split(",") if s.strip()):
        bench_size(size, args, sentences, pairs, questions)
    print(f"\nload average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
