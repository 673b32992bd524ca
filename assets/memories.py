"""Memory assets (`memory_dag/memories/`): facts from the user turns as they arrive (each run
observes the open sessions' new turns and consolidates the closed ones), then entity links of
every new memory.

Thin wrappers over `memory_dag.memories.write_path`. Both write the DuckDB file, so both run in the
`duckdb` pool. `ingest_job` (assets/jobs.py) runs them between the ingest assets: episodes
must be in the store before consolidation, and new facts are embedded and indexed after.
"""

from typing import Any

import dagster as dg

from assets.ingest import workspace_files
from assets.metadata import materialize_result, report_metadata
from assets.resources import MemoryStoreResource
from memory_dag.reports import StageReport


class ConsolidateConfig(dg.Config):
    """`include_open: true` also closes each conversation's newest (live) session (its new turns
    are examined either way)."""

    include_open: bool = False


def _metadata(report: StageReport) -> dict[str, Any]:
    metadata = report_metadata(report)
    from memory_dag.memories import write_path

    if isinstance(report, write_path.WriteReport):
        metadata["method"] = dg.MetadataValue.text(report.method)
        for step, seconds in report.timings.items():
            name = step if step.endswith("_per_edge") else f"{step}_seconds"
            metadata[name] = dg.MetadataValue.float(seconds)
    return metadata


@dg.asset(group_name="memory", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files])
def facts(
    context: dg.AssetExecutionContext, config: ConsolidateConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Facts from the user turns of every session, examined once as they arrive, reconciled
    (ADD/UPDATE/DELETE/NONE) with the same owner's facts, with history, change log and
    relations; changes of sensitive user fields wait in the consent queue."""
    from memory_dag.memories import write_path  # imported when the step runs

    report = write_path.consolidate(memory.settings(), include_open=config.include_open)
    return materialize_result(context, report, echo=memory.progress, metadata=_metadata(report))


@dg.asset(group_name="memory", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files, facts])
def entities(
    context: dg.AssetExecutionContext, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """People, places, projects, dates... of every new episode and fact, in `entities` and
    `memory_entities`."""
    from memory_dag.memories import write_path

    report = write_path.link_pending_entities(memory.settings())
    return materialize_result(context, report, echo=memory.progress, metadata=_metadata(report))


MEMORY_ASSETS = [facts, entities]
