"""Conversation summaries: one partition per conversation, so each can be re-run or backfilled.

Partitions are added by the sensors as conversations appear. One step summarizes every
partition of its run (`BackfillPolicy.single_run()`): an ingest run asks only for the
conversations whose files changed, a backfill of many conversations is one step, and a run
without partitions (a schedule's) brings every conversation up to date. The work is
`memory_dag.summaries.refresh.summarize_conversations`, which skips
conversations whose input has not changed; a summarizer failure fails the run, is recorded
in `events`, and leaves that conversation's previous summary active.
"""

import time
import warnings
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets.embed import chunk_embeddings
from assets.index import SEARCH_INDEX
from assets.ingest import workspace_files
from assets.metadata import log_report, report_metadata
from assets.resources import MemoryStoreResource
from memory_dag.store.connection import StoreLockedError

if TYPE_CHECKING:  # the summarizer pulls in the LLM client, which the code server never needs
    from memory_dag.reports import StageReport
    from memory_dag.summaries.conversation_summaries import SummaryRun

conversations = dg.DynamicPartitionsDefinition(name="conversations")


class SummaryConfig(dg.Config):
    """`force: true` re-summarizes even when the conversation has not changed."""

    force: bool = False


with warnings.catch_warnings():  # `backfill_policy` is "beta" in Dagster 1.13: said once, here
    warnings.simplefilter("ignore", dg.BetaWarning)
    _summaries_asset = dg.asset(
        group_name="summaries",
        pool="duckdb",
        kinds={"duckdb"},
        # Facts (assets/memories.py) are input too; by key, as that module may not be loaded.
        deps=[workspace_files, dg.AssetKey("facts")],
        partitions_def=conversations,
        backfill_policy=dg.BackfillPolicy.single_run(),
    )


@_summaries_asset
def conversation_summaries(
    context: dg.AssetExecutionContext, config: SummaryConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """The adaptive summary tree (NONE … HIERARCHICAL) of each conversation of the run."""
    from memory_dag.summaries.refresh import summarize_conversations, summary_report

    keys = conversation_keys(context)
    started = time.perf_counter()
    try:
        runs = summarize_conversations(memory.settings(), keys, force=config.force)
    except StoreLockedError as error:  # another process writes the file: try again later
        raise dg.RetryRequested(max_retries=3, seconds_to_wait=30) from error
    report = summary_report(runs, time.perf_counter() - started)
    log_report(context, report, echo=memory.progress)
    return dg.MaterializeResult(metadata=summary_metadata(report, runs))


def conversation_keys(context: dg.AssetExecutionContext) -> list[str] | None:
    """The run's conversations; None (every conversation whose input changed) for a run
    without partitions, or whose partitions are shards (a sharded store, assets/shards.py)."""
    partitioned = context.has_partition_key or context.has_partition_key_range
    if not partitioned or context.assets_def.partitions_def != conversations:
        return None
    return list(context.partition_keys)


def summary_metadata(report: "StageReport", runs: "list[SummaryRun]") -> dict[str, Any]:
    """The stage's counts and what it summarized again, each step's seconds, and the details
    of the conversation when the step had one (a re-run of it from the UI)."""
    metadata = report_metadata(report)
    for step in ("gather", "summarize", "write"):
        seconds = sum(run.seconds.get(step, 0.0) for run in runs)
        metadata[f"{step}_seconds"] = dg.MetadataValue.float(round(seconds, 3))
    if len(runs) == 1:
        [run] = runs
        metadata.update(
            {
                "status": run.status,
                "level": run.level.value,
                "method": run.method,
                "input_tokens": dg.MetadataValue.int(run.input_tokens),
                "output_tokens": dg.MetadataValue.int(run.output_tokens),
                "compression_ratio": dg.MetadataValue.float(round(run.compression_ratio, 4)),
                "l1_summaries": dg.MetadataValue.int(run.l1),
                "l2_summaries": dg.MetadataValue.int(run.l2),
                "turns": dg.MetadataValue.int(run.turns),
                "facts": dg.MetadataValue.int(run.facts),
                "retired_rows": dg.MetadataValue.int(run.retired),
                "preview": dg.MetadataValue.md(run.preview[:2000] or "_(no summary: too short)_"),
            }
        )
        if run.generation is not None:
            metadata["generation"] = dg.MetadataValue.int(run.generation)
    return metadata


summaries_job = dg.define_asset_job(
    "summaries_job",
    selection=dg.AssetSelection.assets(conversation_summaries),  # partitioned as the asset
    description="Summarize one conversation (the partition).",
)

summary_index_job = dg.define_asset_job(
    "summary_index_job",
    selection=dg.AssetSelection.assets(chunk_embeddings, SEARCH_INDEX),
    description="Embed and index new summaries (incremental: only new texts are embedded).",
)

SUMMARY_ASSETS = [conversation_summaries]
SUMMARY_JOBS = [summaries_job, summary_index_job]
