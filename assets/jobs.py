"""Jobs over the asset graph: the incremental ingest, and the forced full reindex."""

from __future__ import annotations

import dagster as dg

from assets.ingest import INGEST_ASSETS

_FORCEABLE = ["workspace_files", "chunks", "search_index", "chunks_fts"]

ingest_job = dg.define_asset_job(
    "ingest_job",
    selection=dg.AssetSelection.assets(*INGEST_ASSETS),
    description="Incremental sync: new, changed and deleted workspace files, then re-index.",
)

reindex_job = dg.define_asset_job(
    "reindex_job",
    selection=dg.AssetSelection.assets(*INGEST_ASSETS),
    config={"ops": {name: {"config": {"force": True}} for name in _FORCEABLE}},
    description="Forced full reindex: re-read every file, re-chunk, rebuild every index.",
)

JOBS = [ingest_job, reindex_job]
