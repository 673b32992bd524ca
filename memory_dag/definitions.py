"""The Dagster code location: `dagster dev` (via workspace.yaml) loads `defs` from here.

Kept free of heavy imports and of any DuckDB connection: the webserver, the daemon and the
code server all import it. Every step that opens the store is in the `duckdb` pool, so steps
run one at a time anyway: the in-process executor saves a Python process start per step.
"""

import dagster as dg

from assets.checks import INGEST_CHECKS
from assets.evaluation import RETRIEVAL_ASSETS, RETRIEVAL_JOBS, RETRIEVAL_SCHEDULES
from assets.ingest import INGEST_ASSETS
from assets.jobs import JOBS
from assets.maintenance import MAINTENANCE_ASSETS, MAINTENANCE_JOBS
from assets.resources import MemoryStoreResource
from assets.summaries import SUMMARY_ASSETS, SUMMARY_JOBS
from assets.write_path import WRITE_PATH_ASSETS
from schedules.maintenance import SCHEDULES
from schedules.maintenance_jobs import MAINTENANCE_SCHEDULES
from sensors.conversations import SUMMARY_SENSORS
from sensors.sessions import SENSORS as SESSION_SENSORS
from sensors.workspace import SENSORS

defs = dg.Definitions(
    assets=[
        *INGEST_ASSETS,
        *WRITE_PATH_ASSETS,
        *SUMMARY_ASSETS,
        *MAINTENANCE_ASSETS,
        *RETRIEVAL_ASSETS,
    ],
    asset_checks=INGEST_CHECKS,
    jobs=[*JOBS, *SUMMARY_JOBS, *MAINTENANCE_JOBS, *RETRIEVAL_JOBS],
    sensors=[*SENSORS, *SESSION_SENSORS, *SUMMARY_SENSORS],
    schedules=[*SCHEDULES, *MAINTENANCE_SCHEDULES, *RETRIEVAL_SCHEDULES],
    resources={"memory": MemoryStoreResource()},
    executor=dg.in_process_executor,
)
