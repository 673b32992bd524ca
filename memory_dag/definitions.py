"""The Dagster code location: `dagster dev` (via workspace.yaml) loads `defs` from here.

Kept free of heavy imports and of any DuckDB connection: the webserver, the daemon and the
code server all import it. Every step that opens the store is in the `duckdb` pool, so steps
run one at a time anyway: the in-process executor saves a Python process start per step.
"""

import dagster as dg

from assets.checks import INGEST_CHECKS
from assets.eval import EVAL_ASSETS, EVAL_JOBS, EVAL_SCHEDULES
from assets.jobs import JOBS, PIPELINE_ASSETS
from assets.maintenance import MAINTENANCE_ASSETS, MAINTENANCE_JOBS
from assets.read import READ_ASSETS, READ_JOBS, READ_SCHEDULES
from assets.resources import MemoryStoreResource
from assets.shards import configured_shards, sharded_definitions
from assets.summaries import SUMMARY_ASSETS, SUMMARY_JOBS
from schedules.maintenance import SCHEDULES
from schedules.maintenance_jobs import MAINTENANCE_SCHEDULES
from sensors.conversations import SUMMARY_SENSORS
from sensors.sessions import SENSORS as SESSION_SENSORS
from sensors.workspace import SENSORS

defs = dg.Definitions(
    assets=[
        *PIPELINE_ASSETS,
        *SUMMARY_ASSETS,
        *MAINTENANCE_ASSETS,
        *READ_ASSETS,
        *EVAL_ASSETS,
    ],
    asset_checks=INGEST_CHECKS,
    jobs=[*JOBS, *SUMMARY_JOBS, *MAINTENANCE_JOBS, *READ_JOBS, *EVAL_JOBS],
    sensors=[*SENSORS, *SESSION_SENSORS, *SUMMARY_SENSORS],
    schedules=[*SCHEDULES, *MAINTENANCE_SCHEDULES, *READ_SCHEDULES, *EVAL_SCHEDULES],
    resources={"memory": MemoryStoreResource()},
    executor=dg.in_process_executor,
)

# A sharded store (MEMORY_DAG_SHARDS > 1): the same graph, partitioned by shard (assets/shards.py).
_shards = configured_shards()
if _shards > 1:
    defs = sharded_definitions(defs, _shards)
