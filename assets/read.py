"""Read-path assets (`memory_dag/read/`): the flush of memory accesses.

`memory_access` adds the accesses queued by reads (`memory_dag.read.access_log.AccessLog`) to
`memories.access_count` / `last_accessed`, which decay depends on; it is the only writer of
those columns, and runs in the `duckdb` pool like every writer.
"""

import dagster as dg

from assets.resources import MemoryStoreResource
from schedules.crons import cron_schedule


@dg.asset(group_name="retrieval", pool="duckdb", kinds={"duckdb"})
def memory_access(memory: MemoryStoreResource) -> dg.MaterializeResult:
    """Access counts and times of memories returned by reads, applied from the queue files."""
    from memory_dag.read.access_log import apply_access_log

    counts = apply_access_log(memory.settings())
    return dg.MaterializeResult(
        metadata={name: dg.MetadataValue.int(value) for name, value in counts.items()}
    )


memory_access_job = dg.define_asset_job(
    "memory_access_job",
    selection=dg.AssetSelection.assets(memory_access),
    description="Apply queued memory accesses to access_count / last_accessed.",
)

memory_access_schedule = cron_schedule(
    "memory_access",
    memory_access_job,
    "Hourly: access counts for decay, from the reads' queue files.",
)

READ_ASSETS = [memory_access]
READ_JOBS = [memory_access_job]
READ_SCHEDULES = [memory_access_schedule]
