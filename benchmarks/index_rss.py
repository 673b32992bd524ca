"""Peak RSS and seconds of each phase of the `indexes` step (and of the embed stage) on a
store built once (issue 15): tracemalloc misses numpy, FAISS and DuckDB, so RSS is sampled.

    python benchmarks/index_rss.py STORE_DIR [--stage indexes|search_index|chunks_fts|embed]

STORE_DIR holds `memory.duckdb` (and `index/`), e.g. a `--keep` store of whole_graph.py; it is
copied to a scratch folder first, the build is forced. Prints, for each phase (a wrapped
library function), its seconds and the peak RSS while it ran, then the whole stage's peak.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

#: (module, attribute) of the functions timed as phases; nested phases are indented.
PHASES = [
    ("memory_dag.index.build", "fetch_arrow"),
    ("memory_dag.index.build", "_arrow_to_vectors"),
    ("memory_dag.index.build", "_vectors_in_row_order"),
    ("memory_dag.index.build", "plan_change"),
    ("memory_dag.index.build", "publish_index"),
    ("memory_dag.index.build", "stage_rows"),
    ("memory_dag.index.build", "publish_staged"),
    ("memory_dag.index.published", "_write_vector_files"),
    ("memory_dag.index.published", "_write_vector_index"),
    ("memory_dag.index.build", "stage_vectors"),
    ("memory_dag.index.published", "bm25_documents"),
    ("memory_dag.index.text_index", "tokenize_corpus"),
    ("memory_dag.index.published", "TextIndex.build"),
    ("memory_dag.index.published", "install_version"),
    ("memory_dag.index.build", "build_fts_index"),
    ("memory_dag.embed.chunk_embeddings", "fetch_arrow"),
    ("memory_dag.embed.chunk_embeddings", "_write_embeddings"),
]


class Sampler:
    """RSS of this process every `interval` seconds; the peak within any time span."""

    def __init__(self, interval: float = 0.02) -> None:
        self.samples: list[tuple[float, int]] = []
        self._process = psutil.Process()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._done.is_set():
            self.samples.append((time.perf_counter(), self._process.memory_info().rss))
            self._done.wait(interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def peak(self, start: float, end: float) -> int:
        inside = [rss for at, rss in self.samples if start <= at <= end]
        return max(inside, default=self._process.memory_info().rss)


def wrap_phases(spans: list[tuple[str, float, float]]) -> None:
    import importlib

    for module_name, attribute in PHASES:
        module = importlib.import_module(module_name)
        owner: Any = module
        *parents, name = attribute.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = getattr(owner, name, None)
        if original is None:  # another version of the code
            continue
        raw = original.__func__ if hasattr(original, "__func__") else original

        def timed(*args: Any, _raw: Any = raw, _label: str = attribute, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _raw(*args, **kwargs)
            finally:
                spans.append((_label, started, time.perf_counter()))

        if hasattr(original, "__func__"):
            setattr(owner, name, classmethod(functools.wraps(raw)(timed)))
        else:
            setattr(owner, name, functools.wraps(raw)(timed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("store", type=Path)
    parser.add_argument(
        "--stage", default="indexes", choices=["indexes", "search_index", "chunks_fts", "embed"]
    )
    parser.add_argument("--scratch", type=Path, default=Path("/tmp"))
    args = parser.parse_args()

    from memory_dag.config import Settings
    from memory_dag.embed.providers import get_provider

    scratch = Path(tempfile.mkdtemp(prefix="index-rss-", dir=args.scratch))
    try:
        shutil.copy(args.store / "memory.duckdb", scratch / "memory.duckdb")
        if (args.store / "index").exists():
            shutil.copytree(args.store / "index", scratch / "index")
        settings = Settings.load(db_path=scratch / "memory.duckdb", index_dir=scratch / "index")
        get_provider(settings)  # the model loaded before, as in a run
        if args.stage == "embed":
            import duckdb

            con = duckdb.connect(str(scratch / "memory.duckdb"))
            con.execute("DELETE FROM embedding_cache")
            con.close()
        spans: list[tuple[str, float, float]] = []
        wrap_phases(spans)
        from memory_dag.embed.chunk_embeddings import embed_chunks
        from memory_dag.index.build import build_fts_index, build_indexes, build_search_index

        sampler = Sampler()
        base = psutil.Process().memory_info().rss
        sampler.start()
        started = time.perf_counter()
        if args.stage == "indexes":
            reports = list(build_indexes(settings, force=True))
        elif args.stage == "search_index":
            reports = [build_search_index(settings, force=True)]
        elif args.stage == "chunks_fts":
            reports = [build_fts_index(settings, force=True)]
        else:
            reports = [embed_chunks(settings)]
        ended = time.perf_counter()
        sampler.stop()
        print(f"RSS before the stage: {base / 1e9:.2f} GB")
        for label, start, end in sorted(spans, key=lambda span: span[1]):
            print(
                f"  {label:<28} {start - started:7.2f} → {end - started:7.2f} s "
                f"({end - start:6.2f} s)  peak {sampler.peak(start, end) / 1e9:5.2f} GB"
            )
        for report in reports:
            print(f"  {report.stage}: {report.seconds:.2f} s {report.counts}")
        print(
            f"stage {args.stage}: {ended - started:.2f} s, "
            f"peak RSS {sampler.peak(started, ended) / 1e9:.2f} GB"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
