"""Ingest assets (`memory_dag/ingest/`): workspace files, then chunks.

Both write the one DuckDB file, so both run in the `duckdb` pool (limit 1 in the instance's
dagster.yaml): a sensor run, a schedule run and a UI click never collide.
"""

from collections.abc import Iterator

import dagster as dg

from assets.metadata import log_report, materialize_result, report_metadata
from assets.resources import MemoryStoreResource, RebuildConfig
from memory_dag.graph_state import NOTHING_DUE, work_due


@dg.asset(group_name="ingest", pool="duckdb", kinds={"duckdb"}, output_required=False)
def workspace_files(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> Iterator[dg.MaterializeResult]:
    """Notes and transcripts in `files`, `notes`, `episodes`; bad input in `ingest_errors`.

    The run's first step decides: when nothing changed since the graph last settled
    (`memory_dag.graph_state.work_due`), it records an observation instead of a
    materialization, and Dagster skips every step downstream of it."""
    from memory_dag.ingest.files import sync_files  # PyArrow: when the step runs

    settings = memory.settings()
    report = sync_files(settings, force=config.force)
    due = work_due(settings, force=config.force or _asks_for_more(context))
    if due:
        metadata = {**report_metadata(report), "due": dg.MetadataValue.text("; ".join(due.reasons))}
        yield materialize_result(context, report, echo=memory.progress, metadata=metadata)
        return
    report.notes.append(NOTHING_DUE)
    log_report(context, report, echo=memory.progress)
    context.log_event(
        dg.AssetObservation(asset_key=context.asset_key, metadata=report_metadata(report))
    )


def _asks_for_more(context: dg.AssetExecutionContext) -> bool:
    """The run asks a later step for work beyond the changes: the facts step to close the
    newest sessions too, or the summaries step to summarize again (`force`)."""
    ops = context.run.run_config.get("ops", {})
    facts = ops.get("facts", {}).get("config", {})
    summaries = ops.get("conversation_summaries", {}).get("config", {})
    return bool(facts.get("include_open") or summaries.get("force"))


@dg.asset(group_name="ingest", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files])
def chunks(
    context: dg.AssetExecutionContext, config: RebuildConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Token-based chunks (400/80) of notes, and turn chunks of transcripts, in `chunks`."""
    from memory_dag.ingest.chunks import build_chunks  # Polars, tiktoken: when the step runs

    report = build_chunks(memory.settings(), force=config.force)
    return materialize_result(context, report, echo=memory.progress)


INGEST_ASSETS = [workspace_files, chunks]
