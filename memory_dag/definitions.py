"""The Dagster code location: `dagster dev` (via workspace.yaml) loads `defs` from here.

Kept free of heavy imports and of any DuckDB connection: the webserver, the daemon and the
code server all import it.
"""

from __future__ import annotations

import dagster as dg

from assets.checks import INGEST_CHECKS
from assets.ingest import INGEST_ASSETS
from assets.jobs import JOBS
from assets.resources import MemoryStoreResource
from schedules.maintenance import SCHEDULES
from sensors.workspace import SENSORS

defs = dg.Definitions(
    assets=INGEST_ASSETS,
    asset_checks=INGEST_CHECKS,
    jobs=JOBS,
    sensors=SENSORS,
    schedules=SCHEDULES,
    resources={"memory": MemoryStoreResource()},
)
