"""Ingest and index assets: thin wrappers over `memory_dag.pipeline` stages.

All of them write the one DuckDB file, so all run in the `duckdb` pool (limit 1 in the
instance's dagster.yaml): a sensor run, a schedule run and a UI click never collide.
"""

from collections.abc import Iterator

import dagster as dg

from assets.metadata import log_report, report_metadata
from assets.resources import MemoryStoreResource
from memory_dag import pipeline


class RebuildConfig(dg.Config):
    """`force: true` re-reads, re-chunks and re-indexes everything (the reindex job sets it)."""

    force: bool = False


def _finish(
    context: dg.AssetExecutionContext, memory: MemoryStoreResource, report: pipeline.StageReport
) -> dg.MaterializeResult:
    log_report(context, report, echo=memory.progress)
    return dg.MaterializeResult(metadata=report_metadata(report))


@dg.asset(group_name="ingest", pool="duckdb", kinds={"duckdb"})
def workspace_files(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Notes and transcripts in `files`, `notes`, `episodes`; bad input in `ingest_errors`."""
    report = pipeline.sync_files(memory.settings(), force=config.force)
    return _finish(context, memory, report)


@dg.asset(group_name="ingest", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files])
def chunks(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Token-based chunks (400/80) of notes, and turn chunks of transcripts, in `chunks`."""
    report = pipeline.build_chunks(memory.settings(), force=config.force)
    return _finish(context, memory, report)


@dg.asset(group_name="embed", pool="duckdb", kinds={"duckdb"}, deps=[chunks, dg.AssetKey("facts")])
def chunk_embeddings(
    context: dg.AssetExecutionContext, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """One vector per distinct chunk text and model, in `embedding_cache`."""
    report = pipeline.embed_chunks(memory.settings(), progress=memory.progress)
    return _finish(context, memory, report)


#: The two indexes, materialized by one step (`indexes`) that builds them at the same time.
SEARCH_INDEX = dg.AssetKey("search_index")
CHUNKS_FTS = dg.AssetKey("chunks_fts")


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            SEARCH_INDEX,
            group_name="index",
            kinds={"faiss"},
            deps=[chunks, chunk_embeddings, dg.AssetKey("facts")],
            description="The FAISS vector index and the BM25 index the search path reads, "
            "published atomically.",
        ),
        dg.AssetSpec(
            CHUNKS_FTS,
            group_name="index",
            kinds={"duckdb"},
            deps=[chunks],
            description="DuckDB full-text index on `chunks`, for "
            "`fts_main_chunks.match_bm25(...)` in SQL.",
        ),
    ],
    can_subset=True,
    pool="duckdb",
)
def indexes(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> Iterator[dg.MaterializeResult]:
    """Both indexes in one step, built side by side (`pipeline.build_indexes`)."""
    selected = context.selected_asset_keys
    for report in pipeline.build_indexes(
        memory.settings(),
        force=config.force,
        search_index=SEARCH_INDEX in selected,
        fts=CHUNKS_FTS in selected,
    ):
        log_report(context, report, echo=memory.progress)
        # The stages are named after their assets: "search_index", "chunks_fts".
        yield dg.MaterializeResult(asset_key=report.stage, metadata=report_metadata(report))


INGEST_ASSETS = [workspace_files, chunks, chunk_embeddings, indexes]
