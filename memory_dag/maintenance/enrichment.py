"""Entity enrichment (seed 004), nightly at 02:00.

* `entity_enrichment`: memories (facts, episodes) with at most 2 entity links and no
  `attributes.enriched_at` are linked again, at most 50 a night, and stamped. Skipped, and
  said so, when no accurate extractor (spaCy + en_core_web_sm) is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from memory_dag.config import Settings
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.memories.entities import accurate_extractor_available
from memory_dag.reports import StageReport
from memory_dag.store.connection import listed


def entity_enrichment(
    settings: Settings,
    now: datetime,
    *,
    config: MaintenanceConfig = DEFAULT_CONFIG,
    accurate_available: Callable[[], bool] = accurate_extractor_available,
) -> StageReport:
    """Re-link entities of sparsely linked memories with the accurate extractor (seed 004).

    `accurate_available` says whether the accurate extractor is installed (spaCy + model).
    """
    report = common.new_report("entity_enrichment")
    with common.timed(report):
        if not accurate_available():
            report.skipped = True
            report.notes.append(
                "skipped: no accurate extractor installed (spaCy with en_core_web_sm); "
                "the fast extractor already linked these memories"
            )
            return report
        with common.maintenance_writer(settings, common.aware(now)) as writer:
            pending = writer.con.execute(
                """
                SELECT m.id, m.content FROM memories m
                WHERE m.valid_until IS NULL AND m.state = 'active'
                  AND m.kind IN ('fact', 'episode')
                  AND json_extract_string(m.attributes, '$.enriched_at') IS NULL
                  AND (SELECT count(*) FROM memory_entities l WHERE l.memory_id = m.id) <= ?
                ORDER BY m.created_at DESC, m.id LIMIT ?
                """,
                [config.enrichment_max_entities, config.enrichment_limit],
            ).fetchall()
            ids = [row[0] for row in pending]
            writer.link_entities([(row[0], row[1]) for row in pending])
            with listed(writer.con, "_enriched", ids):
                writer.con.execute(
                    "UPDATE memories SET attributes = json_merge_patch(coalesce(attributes, "
                    "'{}'::JSON), json_object('enriched_at', ?::VARCHAR)) "
                    "WHERE id IN (SELECT value FROM _enriched)",
                    [common.aware(now).isoformat()],
                )
        report.counts["examined"] = len(ids)
        report.counts["entity_links"] = writer.counts.get("entity_links", 0)
        report.counts["entities_created"] = writer.counts.get("entities_created", 0)
    return report
