"""Write-path assets: facts from closed sessions, then entity links of every new memory.

Thin wrappers over `memory_dag.write_path`. Both write the DuckDB file, so both run in the
`duckdb` pool. `ingest_job` (assets/jobs.py) runs them between the ingest assets: episodes
must be in the store before consolidation, and new facts are embedded and indexed after.
"""

from typing import Any

import dagster as dg

from assets.ingest import workspace_files
from assets.metadata import log_report, report_metadata
from assets.resources import MemoryStoreResource
from memory_dag import write_path
from memory_dag.pipeline import StageReport


class ConsolidateConfig(dg.Config):
    """`include_open: true` also consolidates each conversation's newest (live) session."""

    include_open: bool = False


def _metadata(report: StageReport) -> dict[str, Any]:
    metadata = report_metadata(report)
    if isinstance(report, write_path.WriteReport):
        metadata["method"] = dg.MetadataValue.text(report.method)
        for step, seconds in report.timings.items():
            name = step if step.endswith("_per_edge") else f"{step}_seconds"
            metadata[name] = dg.MetadataValue.float(seconds)
    return metadata


def _finish(
    context: dg.AssetExecutionContext, memory: MemoryStoreResource, report: StageReport
) -> dg.MaterializeResult:
    log_report(context, report, echo=memory.progress)
    return dg.MaterializeResult(metadata=_metadata(report))


@dg.asset(group_name="memory", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files])
def facts(
    context: dg.AssetExecutionContext, config: ConsolidateConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Facts from the user turns of closed sessions, reconciled (ADD/UPDATE/DELETE/NONE) with
    the conversation's facts, with history, change log and relations."""
    report = write_path.consolidate(memory.settings(), include_open=config.include_open)
    return _finish(context, memory, report)


@dg.asset(group_name="memory", pool="duckdb", kinds={"duckdb"}, deps=[workspace_files, facts])
def entities(
    context: dg.AssetExecutionContext, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """People, places, projects, dates... of every new episode and fact, in `entities` and
    `memory_entities`."""
    report = write_path.link_pending_entities(memory.settings())
    return _finish(context, memory, report)


WRITE_PATH_ASSETS = [facts, entities]
