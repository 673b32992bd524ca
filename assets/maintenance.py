"""Maintenance assets (issue 5): one per nightly job, thin wrappers over `memory_dag.maintenance`.

Each materialization's metadata says what the job changed (examined, merged, decayed,
soft_deleted, purged, created) and how long it took. The assets depend on each other in the
order of a night (enrichment, consolidation, the Sunday reflection, dedup, decay, lifecycle,
insights), so `maintenance_job` runs them in that order; each schedule runs its own one-asset
job. All open the DuckDB file, so all run in the `duckdb` pool.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

from assets.metadata import log_report, report_metadata
from assets.resources import MemoryStoreResource

GROUP = "maintenance"
KEY_PREFIX = "maintenance"
AS_OF_TAG = "memory_dag/as_of"


class MaintenanceRunConfig(dg.Config):
    """`as_of` (ISO 8601) is the job's clock; empty means now. Schedules set it to their tick,
    so a re-executed run decays, expires and purges exactly as the original did."""

    as_of: str = ""

    def now(self) -> datetime:
        if not self.as_of:
            return datetime.now(UTC)
        moment = datetime.fromisoformat(self.as_of)
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _run(
    context: dg.AssetExecutionContext,
    memory: MemoryStoreResource,
    config: MaintenanceRunConfig,
    job: str,
) -> dg.MaterializeResult:
    from memory_dag.maintenance.nightly import JOBS  # the library (Polars…): when a run needs it

    report = JOBS[job](memory.settings(), config.now())
    log_report(context, report, echo=memory.progress)
    return dg.MaterializeResult(metadata=report_metadata(report))


def _asset(name: str, deps: list[dg.AssetsDefinition] | None = None) -> Any:
    """The decorator every maintenance asset shares (group, pool, key prefix)."""
    return dg.asset(
        name=name,
        key_prefix=KEY_PREFIX,
        group_name=GROUP,
        pool="duckdb",
        kinds={"duckdb"},
        deps=deps or [],
    )


@_asset("entity_enrichment")
def entity_enrichment(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Entities of sparsely linked memories re-extracted accurately (skipped without spaCy)."""
    return _run(context, memory, config, "entity_enrichment")


@_asset("session_consolidation", deps=[entity_enrichment])
def session_consolidation(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Every pending session consolidated into facts (the session sensor's code)."""
    return _run(context, memory, config, "session_consolidation")


@_asset("weekly_reflection", deps=[session_consolidation])
def weekly_reflection(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """A `weekly` reflection per scope with enough facts this week (at most once per 6 days)."""
    return _run(context, memory, config, "reflection")


@_asset("dedup_merge", deps=[weekly_reflection])
def dedup_merge(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Near-duplicate facts merged (MERGE in history, both provenances kept)."""
    return _run(context, memory, config, "dedup_merge")


@_asset("decay", deps=[dedup_merge])
def decay(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Confidence decayed; memories below 0.05 soft-deleted and out of the index."""
    return _run(context, memory, config, "decay")


@_asset("lifecycle", deps=[decay])
def lifecycle(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Purge past purge_at, 60-day TTL soft deletes, eviction above max_entries."""
    return _run(context, memory, config, "lifecycle")


@_asset("insights", deps=[lifecycle])
def insights(
    context: dg.AssetExecutionContext, config: MaintenanceRunConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Theory-of-mind insights from recent activity (needs an LLM; skipped and said so)."""
    return _run(context, memory, config, "insights")


MAINTENANCE_ASSETS = [
    entity_enrichment,
    session_consolidation,
    weekly_reflection,
    dedup_merge,
    decay,
    lifecycle,
    insights,
]


entity_enrichment_job = dg.define_asset_job(
    "entity_enrichment_job", selection=[entity_enrichment], description="Nightly, 02:00."
)
session_consolidation_job = dg.define_asset_job(
    "session_consolidation_job", selection=[session_consolidation], description="Nightly, 03:00."
)
dedup_merge_job = dg.define_asset_job(
    "dedup_merge_job", selection=[dedup_merge], description="Nightly, 03:30."
)
decay_job = dg.define_asset_job("decay_job", selection=[decay], description="Nightly, 04:00.")
lifecycle_job = dg.define_asset_job(
    "lifecycle_job", selection=[lifecycle], description="Nightly, 04:30."
)
reflection_job = dg.define_asset_job(
    "reflection_job", selection=[weekly_reflection], description="Sundays, 03:00."
)
insights_job = dg.define_asset_job(
    "insights_job", selection=[insights], description="Background, every 4 hours."
)
maintenance_job = dg.define_asset_job(
    "maintenance_job",
    selection=dg.AssetSelection.groups(GROUP),
    description="Every maintenance job once, in the order of a night (manual runs).",
)

MAINTENANCE_JOBS = [
    entity_enrichment_job,
    session_consolidation_job,
    dedup_merge_job,
    decay_job,
    lifecycle_job,
    reflection_job,
    insights_job,
    maintenance_job,
]
