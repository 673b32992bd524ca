"""Jobs over the asset graph: the incremental ingest, and the forced full reindex.

`ingest_job` runs the whole graph: files, chunks, facts, entities, the summaries of the
conversations that changed, embeddings and both indexes, with every check. `ingest_run` says
what a run over some changed conversations asks for; the sensors and `memory-dag ingest` use
it. `reindex_job` re-reads and rebuilds everything but the summaries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import dagster as dg
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from assets.embed import EMBED_ASSETS
from assets.index import INDEX_ASSETS
from assets.ingest import INGEST_ASSETS
from assets.memories import MEMORY_ASSETS
from assets.summaries import SUMMARY_ASSETS, conversation_summaries

#: Files → chunks → embeddings → indexes: the first stages, without facts and entities.
FIRST_STAGES = [*INGEST_ASSETS, *EMBED_ASSETS, *INDEX_ASSETS]
#: What `ingest_job` materializes: the first stages, facts, entities and summaries.
PIPELINE_ASSETS = [*FIRST_STAGES, *MEMORY_ASSETS, *SUMMARY_ASSETS]

#: Steps (ops) that take `force`; `indexes` builds both search_index and chunks_fts.
_FORCEABLE = ["workspace_files", "chunks", "indexes"]
_PIPELINE = dg.AssetSelection.assets(*PIPELINE_ASSETS)

ingest_job = dg.define_asset_job(
    "ingest_job",
    selection=_PIPELINE,
    description="Incremental sync of the workspace, facts of closed sessions, entities, the "
    "summaries of the conversations asked for (every one when none is), re-index.",
)

reindex_job = dg.define_asset_job(
    "reindex_job",
    # Without the summaries, which a re-read does not change (their inputs' fingerprints
    # stay), the job is unpartitioned, and its `force` config applies however it is launched.
    selection=_PIPELINE - dg.AssetSelection.assets(*SUMMARY_ASSETS),
    config={"ops": {name: {"config": {"force": True}} for name in _FORCEABLE}},
    description="Forced full reindex: re-read every file, re-chunk, rebuild every index.",
)

JOBS = [ingest_job, reindex_job]


@dataclass(frozen=True)
class IngestRun:
    """What an ingest run over some changed conversations asks for."""

    #: Conversations that are not partitions yet (add them before the run).
    new_partitions: list[str]
    #: The run's tags: the narrowest range of conversation partitions holding every changed
    #: one (unchanged ones inside it are skipped by the summaries step, cheaply).
    tags: dict[str, str]
    #: The assets to run; None is all of them. Without changed conversations: no summaries.
    asset_selection: list[dg.AssetKey] | None


def ingest_run(known: Sequence[str], changed: Iterable[str]) -> IngestRun:
    """The ingest run that summarizes the `changed` conversations, given the partitions
    `known` (in their order; new ones are appended, sorted, as they will be added)."""
    wanted = {conversation for conversation in changed if "..." not in conversation}
    new = sorted(wanted - set(known))
    if not wanted:
        keys = [key for asset in PIPELINE_ASSETS for key in asset.keys]
        return IngestRun(new, {}, [k for k in keys if k != conversation_summaries.key])
    order = [*known, *new]
    inside = [key for key in order if key in wanted]
    tags = {ASSET_PARTITION_RANGE_START_TAG: inside[0], ASSET_PARTITION_RANGE_END_TAG: inside[-1]}
    return IngestRun(new, tags, None)
