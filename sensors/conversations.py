"""Summaries written outside an ingest run are embedded and indexed by a sensor.

An ingest run summarizes the conversations that changed before it embeds and indexes, so its
summaries are searchable when it ends. A run of `summaries_job` (re-running a conversation
from the UI, a backfill) does not index: `summaries_indexed_sensor` then asks for
`summary_index_job`, so searches with kind="summary" find the new summaries. (Partitions are
added by the workspace and sessions sensors, as conversations appear.)
"""

import dagster as dg

from assets.index import SEARCH_INDEX
from assets.summaries import conversation_summaries, summary_index_job


def indexed_by_its_run(run: dg.DagsterRun | None) -> bool:
    """Whether the run that wrote summaries also rebuilt the search index after them."""
    if run is None:
        return False
    if not run.asset_selection:  # the whole job
        return run.job_name in ("ingest_job", "reindex_job")
    return SEARCH_INDEX in run.asset_selection


@dg.asset_sensor(
    asset_key=conversation_summaries.key,
    job=summary_index_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Embeds and indexes summaries written by a run that did not index them.",
)
def summaries_indexed_sensor(
    context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry
) -> dg.RunRequest | dg.SkipReason:
    if indexed_by_its_run(context.instance.get_run_by_id(asset_event.run_id)):
        return dg.SkipReason(f"run {asset_event.run_id} indexed its own summaries")
    return dg.RunRequest(
        run_key=f"summary-index:{asset_event.run_id}",
        tags={"memory_dag/after_run": asset_event.run_id},
    )


SUMMARY_SENSORS = [summaries_indexed_sensor]
