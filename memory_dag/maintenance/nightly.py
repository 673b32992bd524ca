"""Nightly maintenance of the memory store (issue 5): one function per scheduled job.

Every job takes the settings and `now`, the job's clock (schedules pass their scheduled time,
tests move it forward), and returns a `StageReport` whose counts always hold `examined`,
`merged`, `decayed`, `soft_deleted`, `purged` and `created`, plus the job's own counts. Each
job works without an LLM and uses one when `Settings.llm_configured`. No connection is held
during an LLM call: a job reads, thinks, then writes in one short transaction. Every change is
recorded through `MemoryWriter` (`history`, and a `change_log` row per transition).
A job that changed what the search index holds republishes it before returning, so a
soft-deleted memory leaves the vector index in the same run.

Jobs (seed 004, seed 003 §3, §4, §7, §12, seed 000 §4.5):

* `entity_enrichment`: memories (facts, episodes) with at most 2 entity links and no
  `attributes.enriched_at` are linked again, at most 50 a night, and stamped. Skipped, and
  said so, when no accurate extractor (spaCy + en_core_web_sm) is installed.
* `consolidate_pending`: `write_path.consolidate(include_open=True)`, the code the session
  sensor runs, so every pending session is consolidated.
* `dedup_merge`: candidates (facts changed in 72 h, importance >= 3, or in the top decile by
  access count) are paired with facts of the same scope (user, else conversation). A pair is
  kept when its cosine is >= 0.75, its newer member changed in the last 90 days, and the texts
  share content words (Jaccard >= 0.3) or differ by a number ("2 kids" / "3 kids"). Pairs
  judged in the last 14 days (`merge_fingerprints`) are skipped; a scope gets one pass a day
  with at most 50 pairs, judged by the LLM in batches of 8 or by `reconcile.relate` (duplicate
  or update -> same fact). A merge keeps the newer fact with the union of both provenances.
* `decay`: `confidence × exp(−decay_rate × days)` since the later of the last access (or
  creation) and the last decay, counted to the start of `now`'s day; below 0.05 the memory is
  soft-deleted (purge in 30 days) and its entity links removed. `decay_rate = 0` never decays.
* `lifecycle`: purge of what was due (`purge_at`) before the day began; TTL (not accessed since
  60 days before the day began, importance < 3, not pinned, decay_rate > 0) -> soft-deleted
  with `purge_at` = +30 days; eviction of the oldest facts and turns of a conversation above
  500 active memories (summaries and pinned memories exempt).
* `reflection`: per scope, at most once per 6 days and only with >= 3 facts in the last 7 days,
  a `reflection` memory tagged `weekly` with `decay_rate` 0: the LLM's, else the week's 5 most
  important facts (extractive).
* `insights`: per scope with new facts in the last 24 h and no insights run in the last 24 h,
  1-3 third-person insights of at most 280 characters, kind `insight`, category
  `relationship_dynamic`, importance 2. Needs an LLM: without one the job is skipped, and says
  why (rules cannot read trust or emotion from facts honestly).

`remember_procedure` stores a procedural memory (seed 003 §12): numbered steps, category
`procedural`, which default retrieval leaves out.

Decisions:

* Time-based rules move once a day (decay, TTL and purge count to the start of `now`'s day),
  so a second run on the same day finds nothing more to do. Decay is idempotent by
  construction: each memory carries `attributes.decayed_at`, the day boundary its confidence
  was last decayed to, and a run decays only the time since then (or since a later access).
  Decaying in one step or in many gives the same confidence.
* Confidence-only decay leaves one job-level `DECAY` history row (memory_id NULL) with the
  counts and the day, not one row per memory per night; each memory's `decayed_at` says when
  it was decayed. Every state transition (decay, TTL or eviction soft delete, merge, purge,
  new memory) has its own history row and one change-log row.
* Soft deletes by these jobs set `valid_until` and `purge_at` from the job's clock (the
  writer's own `soft_delete` stamps the wall clock) and remove the memory's entity links (the
  entities' mention counts follow). Merged-away facts get `replaced_by` and no purge date: they
  are the survivor's provenance.
* Scopes: a memory belongs to its user when it has one, else to its conversation. The dedup
  cap, reflections and insights are per scope; pairs never cross scopes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from memory_dag.config import Settings
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.maintenance.consolidation import consolidate_pending
from memory_dag.maintenance.decay import decay
from memory_dag.maintenance.dedup import dedup_merge
from memory_dag.maintenance.enrichment import entity_enrichment
from memory_dag.maintenance.insights import insights
from memory_dag.maintenance.lifecycle import lifecycle
from memory_dag.maintenance.reflection import reflection
from memory_dag.reports import StageReport

Job = Callable[..., StageReport]

#: Every job by name, in the order the schedules run them in a night.
JOBS: dict[str, Job] = {
    "entity_enrichment": entity_enrichment,  # 02:00
    "session_consolidation": consolidate_pending,  # 03:00
    "reflection": reflection,  # Sundays 03:00, after the night's consolidation
    "dedup_merge": dedup_merge,  # 03:30
    "decay": decay,  # 04:00
    "lifecycle": lifecycle,  # 04:30
    "insights": insights,  # background
}


def run_nightly(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> list[StageReport]:
    """Every job once, in schedule order (the CLI and the benchmark; Dagster runs them apart)."""
    return [job(settings, now, config=config) for job in JOBS.values()]
