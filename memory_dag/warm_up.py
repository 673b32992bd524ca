"""Load, once per worker process, what the first run of the asset graph would load itself.

The code location stays light (the daemon and the webserver import it and never run a step),
so each step imports its library when it runs, and the embedding model loads on first use. A
process that runs many short runs one after the other, a Celery worker of a sharded
deployment, paid all of it in its first run: 1.3 s in a worker's log here (under cProfile
2.5 s: the imports 1.5, the WordLlama model 0.7), a fifth of a small shard's run. Warming the
process up when it starts takes that out of the runs. The one-off CLI and `dagster dev` do
not call it. Within a run, the chunks stage loads the model beside its own last work
(`load_embedder_in_background`), for the stages after it.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time

from memory_dag.config import Settings

#: The library modules the assets import when their steps run (the stages of `ingest_job` and
#: the nightly jobs), with Polars, PyArrow, DuckDB, FAISS and tiktoken behind them.
STAGE_MODULES = (
    "memory_dag.ingest.files",
    "memory_dag.ingest.chunks",
    "memory_dag.embed.chunk_embeddings",
    "memory_dag.memories.write_path",
    "memory_dag.summaries.refresh",
    "memory_dag.index.build",
    "memory_dag.maintenance.nightly",
    "memory_dag.store.quality",
)

#: Embedding providers that load a model into the process (the others call a server).
LOCAL_PROVIDERS = ("wordllama", "onnx")


def warm_up(settings: Settings | None = None) -> float:
    """Import the stage modules, load the token encoding and the local embedding model.

    Returns the seconds it took. A model that cannot load is left for the run to report.
    """
    from memory_dag.ingest.tokens import get_encoding

    started = time.perf_counter()
    for name in STAGE_MODULES:
        importlib.import_module(name)
    get_encoding()
    _load_local_embedder(Settings.load() if settings is None else settings)
    return time.perf_counter() - started


def load_embedder_in_background(settings: Settings) -> threading.Thread | None:
    """Load the local embedding model in a daemon thread; returns the thread (None when the
    provider calls a server instead).

    The chunks stage calls this as it closes the store after chunking files: the stages after
    it (facts, entities, embeddings) embed, and the first of them paid the model's load (~2 s
    on one core, mostly the wheel's import and its tokenizer), while the close's checkpoint,
    DuckDB's work outside the GIL, left a core idle. The provider's lock makes a stage that
    embeds before the load ends wait for it instead of loading a second copy.
    """
    if settings.embedding_provider not in LOCAL_PROVIDERS:
        return None
    thread = threading.Thread(
        target=_load_local_embedder, args=(settings,), name="load-embedder", daemon=True
    )
    thread.start()
    return thread


def _load_local_embedder(settings: Settings) -> None:
    """Load the model of a local provider. A model that cannot load is left for the stage
    that embeds to report: it fails with the provider's own error, where the run's user sees
    it."""
    from memory_dag.embed.providers import EmbeddingError, get_provider

    if settings.embedding_provider in LOCAL_PROVIDERS:
        with contextlib.suppress(EmbeddingError, OSError):
            get_provider(settings).embed(["warm up"])
