"""Session consolidation, nightly at 03:00.

* `consolidate_pending`: `write_path.consolidate(include_open=True)`, the code the session
  sensor runs, so every pending session is consolidated.
"""

from __future__ import annotations

from datetime import datetime

from memory_dag.config import Settings
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.reports import StageReport


def consolidate_pending(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Consolidate every pending session, the open ones too, with the session sensor's code,
    at the job's clock `now`. The index is republished when facts changed."""
    from memory_dag.memories import write_path

    report = common.new_report("session_consolidation")
    with common.timed(report):
        written = write_path.consolidate(settings, include_open=True, now=common.aware(now))
        counts = written.counts
        report.counts.update(counts)
        report.counts["examined"] = counts.get("turns_examined", 0)
        report.counts["created"] = counts.get("facts_added", 0) + counts.get("facts_updated", 0)
        report.counts["soft_deleted"] = counts.get("facts_deleted", 0) + counts.get(
            "facts_updated", 0
        )
        report.notes.extend(written.notes)
        report.preview = written.preview
        if report.counts["created"] or report.counts["soft_deleted"]:
            common.refresh_index(settings, report)
    return report
