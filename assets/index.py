"""Index assets (`memory_dag/index/`): the published FAISS + BM25 search index and, built
beside it in the same step, DuckDB's FTS index for SQL.
"""

from collections.abc import Iterator

import dagster as dg

from assets.embed import chunk_embeddings
from assets.ingest import chunks
from assets.metadata import log_report, report_metadata
from assets.resources import MemoryStoreResource, RebuildConfig

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
    """Both indexes in one step, built side by side (`build_indexes`)."""
    from memory_dag.index.build import build_indexes  # FAISS, SciPy: when the step runs

    selected = context.selected_asset_keys
    for report in build_indexes(
        memory.settings(),
        force=config.force,
        search_index=SEARCH_INDEX in selected,
        fts=CHUNKS_FTS in selected,
        settle=runs_every_stage(context),
    ):
        log_report(context, report, echo=memory.progress)
        # The stages are named after their assets: "search_index", "chunks_fts".
        yield dg.MaterializeResult(asset_key=report.stage, metadata=report_metadata(report))


#: The stages a run must hold for its index step to settle the graph (`graph_state`); the
#: summaries are asked for only when conversations changed, so they may be left out.
WHOLE_GRAPH = {
    dg.AssetKey(name)
    for name in ("workspace_files", "chunks", "facts", "entities", "chunk_embeddings")
} | {SEARCH_INDEX, CHUNKS_FTS}


def runs_every_stage(context: dg.AssetExecutionContext) -> bool:
    """The run materializes every stage (a run of one stage from the UI settles nothing)."""
    selected = context.run.asset_selection or (
        context.job_def.asset_layer.asset_graph.executable_asset_keys
    )
    return set(selected) >= WHOLE_GRAPH


INDEX_ASSETS = [indexes]
