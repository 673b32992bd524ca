"""Conversation summaries: one partition per conversation, so each can be re-run or backfilled.

The partitions are added by `sensors/conversations.py` as conversations appear. The work is
`memory_dag.summaries.conversation_summaries.summarize_conversation`; a summarizer failure
fails the run, is recorded in `events`, and leaves the previous summary active.
"""

import dagster as dg

from assets.embed import chunk_embeddings
from assets.index import SEARCH_INDEX
from assets.ingest import workspace_files
from assets.resources import MemoryStoreResource
from memory_dag.store.connection import StoreLockedError

conversations = dg.DynamicPartitionsDefinition(name="conversations")


class SummaryConfig(dg.Config):
    """`force: true` re-summarizes even when the conversation has not changed."""

    force: bool = False


@dg.asset(
    group_name="summaries",
    pool="duckdb",
    kinds={"duckdb"},
    # Facts (assets/memories.py) are input too; by key, as that module may not be loaded.
    deps=[workspace_files, dg.AssetKey("facts")],
    partitions_def=conversations,
)
def conversation_summaries(
    context: dg.AssetExecutionContext, config: SummaryConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """The adaptive summary tree (NONE … HIERARCHICAL) of one conversation in `summaries`."""
    # Imported here: the summarizer pulls in the LLM client, which the code server never needs.
    from memory_dag.summaries.conversation_summaries import summarize_conversation

    try:
        run = summarize_conversation(memory.settings(), context.partition_key, force=config.force)
    except StoreLockedError as error:  # another process writes the file: try again later
        raise dg.RetryRequested(max_retries=3, seconds_to_wait=30) from error
    context.log.info(run.line())
    metadata = {
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
    if run.generation is not None:
        metadata["generation"] = dg.MetadataValue.int(run.generation)
    for step, seconds in run.seconds.items():
        metadata[f"{step}_seconds"] = dg.MetadataValue.float(seconds)
    return dg.MaterializeResult(metadata=metadata)


summaries_job = dg.define_asset_job(
    "summaries_job",
    selection=dg.AssetSelection.assets(conversation_summaries),
    partitions_def=conversations,
    description="Summarize one conversation (the partition).",
)

summary_index_job = dg.define_asset_job(
    "summary_index_job",
    selection=dg.AssetSelection.assets(chunk_embeddings, SEARCH_INDEX),
    description="Embed and index new summaries (incremental: only new texts are embedded).",
)

SUMMARY_ASSETS = [conversation_summaries]
SUMMARY_JOBS = [summaries_job, summary_index_job]
