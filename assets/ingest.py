"""Ingest assets (`memory_dag/ingest/`): workspace files, then chunks.

Both write the one DuckDB file, so both run in the `duckdb` pool (limit 1 in the instance's
dagster.yaml): a sensor run, a schedule run and a UI click never collide.
"""

import dagster as dg

from assets.metadata import materialize_result
from assets.resources import MemoryStoreResource, RebuildConfig
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files


@dg.asset(group_name="ingest", pool="duckdb", kinds={"duckdb"})
def workspace_files(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Notes and transcripts in `files`, `notes`, `episodes`; bad input in `ingest_errors`."""
    report = sync_files(memory.settings(), force=config.force)
    return materialize_result(context, report, echo=memory.progress)


@dg.asset(group_name="ingest", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files])
def chunks(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Token-based chunks (400/80) of notes, and turn chunks of transcripts, in `chunks`."""
    report = build_chunks(memory.settings(), force=config.force)
    return materialize_result(context, report, echo=memory.progress)


INGEST_ASSETS = [workspace_files, chunks]
