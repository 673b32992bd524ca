"""What a stage did (`StageReport`): shown as Dagster metadata and printed by the CLI.

Every stage of every package returns one, so the Dagster layer and the CLI handle them alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

PREVIEW_ROWS = 10


@dataclass
class StageReport:
    """What one stage did: shown as asset metadata in Dagster and printed by the CLI."""

    stage: str
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    preview: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: bool = False
    #: The conversations whose rows this run of the stage recomputed (facts, entities, ...).
    conversations: list[str] = field(default_factory=list)

    def line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        state = "unchanged, skipped" if self.skipped else counts
        return f"{self.stage:<16} {state}  ({self.seconds:.2f}s)"


class StageTimer:
    def __init__(self, report: StageReport) -> None:
        self.report = report
        self.start = time.perf_counter()

    def __enter__(self) -> StageReport:
        return self.report

    def __exit__(self, *exc: object) -> None:
        self.report.seconds = round(time.perf_counter() - self.start, 3)
