"""Jobs over the asset graph: the incremental ingest, and the forced full reindex."""

from __future__ import annotations

import dagster as dg

from assets.embed import EMBED_ASSETS
from assets.index import INDEX_ASSETS
from assets.ingest import INGEST_ASSETS
from assets.memories import MEMORY_ASSETS

#: Files → chunks → embeddings → indexes: the first stages, without facts and entities.
FIRST_STAGES = [*INGEST_ASSETS, *EMBED_ASSETS, *INDEX_ASSETS]
#: What `ingest_job` materializes: the first stages plus facts and entities.
PIPELINE_ASSETS = [*FIRST_STAGES, *MEMORY_ASSETS]

#: Steps (ops) that take `force`; `indexes` builds both search_index and chunks_fts.
_FORCEABLE = ["workspace_files", "chunks", "indexes"]
_PIPELINE = dg.AssetSelection.assets(*PIPELINE_ASSETS)

ingest_job = dg.define_asset_job(
    "ingest_job",
    selection=_PIPELINE,
    description="Incremental sync of the workspace, facts of closed sessions, entities, re-index.",
)

reindex_job = dg.define_asset_job(
    "reindex_job",
    selection=_PIPELINE,
    config={"ops": {name: {"config": {"force": True}} for name in _FORCEABLE}},
    description="Forced full reindex: re-read every file, re-chunk, rebuild every index.",
)

JOBS = [ingest_job, reindex_job]
