"""Turning a library `StageReport` into Dagster materialization metadata."""

from __future__ import annotations

from typing import Any

import dagster as dg

from memory_dag.reports import StageReport


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_(no rows)_"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row[c]).replace("|", "\\|").replace("\n", " ")[:120] for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_metadata(report: StageReport) -> dict[str, Any]:
    metadata: dict[str, Any] = {name: dg.MetadataValue.int(v) for name, v in report.counts.items()}
    metadata["seconds"] = dg.MetadataValue.float(report.seconds)
    metadata["skipped"] = dg.MetadataValue.bool(report.skipped)
    if report.notes:
        metadata["notes"] = dg.MetadataValue.text("\n".join(report.notes))
    if report.preview:
        metadata["preview"] = dg.MetadataValue.md(_markdown_table(report.preview))
    if report.conversations:
        shown = ", ".join(report.conversations[:50])
        more = len(report.conversations) - 50
        metadata["recomputed_conversations"] = dg.MetadataValue.text(
            shown + (f" … and {more} more" if more > 0 else "")
        )
    if report.errors:
        metadata["error_details"] = dg.MetadataValue.md(_markdown_table(report.errors[:50]))
    return metadata


def materialize_result(
    context: dg.AssetExecutionContext,
    report: StageReport,
    *,
    echo: bool,
    metadata: dict[str, Any] | None = None,
) -> dg.MaterializeResult:
    """Log a stage's report and turn it into the asset's materialization."""
    log_report(context, report, echo=echo)
    return dg.MaterializeResult(metadata=metadata or report_metadata(report))


def log_report(context: dg.AssetExecutionContext, report: StageReport, *, echo: bool) -> None:
    context.log.info(report.line())
    for note in report.notes:
        context.log.info(note)
    for error in report.errors[:20]:
        context.log.warning(f"{error['path']}:{error['line']}: {error['reason']}")
    if echo:
        import sys

        print(report.line(), file=sys.stderr, flush=True)
