"""Embedding assets (`memory_dag/embed/`): one vector per distinct search text and model."""

import dagster as dg

from assets.ingest import chunks
from assets.metadata import materialize_result
from assets.resources import MemoryStoreResource


@dg.asset(
    group_name="embed",
    pool="duckdb",
    kinds={"duckdb"},
    # Facts and summaries are embedded too; by key, as their modules import this one.
    deps=[chunks, dg.AssetKey("facts"), dg.AssetKey("conversation_summaries")],
)
def chunk_embeddings(
    context: dg.AssetExecutionContext, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """One vector per distinct chunk text and model, in `embedding_cache`."""
    from memory_dag.embed.chunk_embeddings import embed_chunks  # imported when the step runs

    report = embed_chunks(memory.settings())
    return materialize_result(context, report, echo=memory.progress)


EMBED_ASSETS = [chunk_embeddings]
