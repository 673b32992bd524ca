"""The ingest pipeline as plain functions: live writes, files → notes/episodes → chunks →
embeddings → index.

Each stage opens the store briefly, does incremental work, and returns a `StageReport`
(counts, timings, a preview) that the Dagster assets turn into metadata and the CLI prints.
Every stage is idempotent: run it twice and the second run changes nothing.
"""

from __future__ import annotations

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.index.build import build_indexes
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.memories.fold import fold_journal
from memory_dag.reports import StageReport


def run_all(
    settings: Settings, *, force: bool = False, progress: bool = False
) -> list[StageReport]:
    """Every stage in order, in this process: what `memory-dag ingest --no-dagster` does.
    Live writes (the journal) are folded into the store first (`memories/fold.py`)."""
    return [
        fold_journal(settings),
        sync_files(settings, force=force),
        build_chunks(settings, force=force),
        embed_chunks(settings, progress=progress),
        *build_indexes(settings, force=force),
    ]
