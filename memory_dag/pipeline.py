"""The whole pipeline as plain functions, in the order the Dagster job runs its assets.

files → chunks → facts (live writes folded first, `memories/fold.py`) → entities → summaries
→ embeddings → search index and DuckDB FTS

Each stage opens the store briefly, does incremental work, and returns a `StageReport`
(counts, timings, a preview) that the Dagster assets turn into metadata and the CLI prints.
Every stage is idempotent: run it twice and the second run changes nothing. `run_all` is what
`memory_dag.ingest(settings)`, `memory-dag ingest --no-dagster` and the package installed
without the Dagster layer run; it builds the same store as the Dagster job (a test compares
them table by table).
"""

from __future__ import annotations

from contextlib import nullcontext

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.graph_state import NOTHING_DUE, work_due
from memory_dag.index.build import build_indexes
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.llm import LLMClient
from memory_dag.memories.write_path import consolidate, link_pending_entities
from memory_dag.progress import show_progress
from memory_dag.reports import StageReport
from memory_dag.summaries.refresh import conversations_due, summarize_due


def run_all(
    settings: Settings,
    *,
    force: bool = False,
    progress: bool = False,
    include_open: bool = False,
    llm: LLMClient | None = None,
) -> list[StageReport]:
    """Every stage in order, in this process (`progress`: show them on stderr as they run).

    The conversations to summarize are those whose files changed before the run (as the
    Dagster job asks for them); `include_open` also consolidates each conversation's newest
    session; `llm` overrides the configured LLM of the write path. When the files stage finds
    nothing new and the store is still what the last whole run settled on
    (`graph_state.work_due`), only the files stage runs, as in the Dagster job.
    """
    with show_progress() if progress else nullcontext():
        changed = conversations_due(settings)
        files = sync_files(settings, force=force)
        due = include_open or work_due(settings, force=force)  # closing sessions is work
        if not due:  # the graph settled on this store: the later stages would find nothing
            files.notes.append(NOTHING_DUE)
            return [files]
        return [
            files,
            build_chunks(settings, force=force),
            consolidate(settings, include_open=include_open, llm=llm),
            link_pending_entities(settings),
            summarize_due(settings, changed),
            embed_chunks(settings),
            *build_indexes(settings, force=force, settle=True),
        ]


def run_first_stages(
    settings: Settings, *, force: bool = False, progress: bool = False
) -> list[StageReport]:
    """Files → chunks → embeddings → both indexes: searchable turns and notes, without the
    derived memories (what retrieval evaluations measure)."""
    with show_progress() if progress else nullcontext():
        return [
            sync_files(settings, force=force),
            build_chunks(settings, force=force),
            embed_chunks(settings),
            *build_indexes(settings, force=force),
        ]
