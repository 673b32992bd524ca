"""`memory-dag eval locomo`: turn-level recall@k on LoCoMo long conversations.

Each conversation file becomes a workspace of session transcripts (turn id = `dia_id`,
speaker = `speaker`, `created_at` = the session date; a shared photo is kept as its
caption, as a chat transcript would show it). The workspace goes through the normal
pipeline into a fresh store, and every question of category 1–4 is asked as a search
scoped to its conversation. recall@k counts the first k *distinct turns* in ranked order,
so a result covering three turns uses three of the k.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memory_dag.config import Settings
from memory_dag.index.search import Searcher, SearchFilters
from memory_dag.pipeline import run_first_stages

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_EVIDENCE = re.compile(r"D\d+:\d+")


def conversation_id(path: Path) -> str:
    return f"locomo-{path.stem}"


def _conversation(data: dict[str, Any]) -> dict[str, Any]:
    return data["conversation"] if isinstance(data.get("conversation"), dict) else data


def _session_numbers(conversation: dict[str, Any]) -> list[int]:
    numbers = []
    for key, value in conversation.items():
        match = re.fullmatch(r"session_(\d+)", key)
        if match and isinstance(value, list):
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def parse_locomo_date(text: str | None) -> datetime | None:
    """'1:56 pm on 8 May, 2023' → an aware datetime (UTC: the data has no timezone)."""
    if not text:
        return None
    for pattern in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(text.strip(), pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def turn_text(turn: dict[str, Any]) -> str:
    """A turn's text as a chat transcript would carry it: a shared photo as its caption and
    the photo's search words (LoCoMo's `query`), as an image attachment's alt text would."""
    text = str(turn.get("text", "")).strip()
    if turn.get("blip_caption"):
        text += f" [shares {turn['blip_caption']}]"
    if turn.get("query"):
        text += f" [{turn['query']}]"
    return text.strip()


def write_workspace(files: list[Path], workspace: Path) -> dict[str, int]:
    """Write each conversation's sessions as `sessions/<conversation>/session_N.jsonl`."""
    counts = {"conversations": 0, "sessions": 0, "turns": 0}
    for path in files:
        conversation = _conversation(json.loads(path.read_text()))
        folder = workspace / "sessions" / conversation_id(path)
        folder.mkdir(parents=True, exist_ok=True)
        counts["conversations"] += 1
        for number in _session_numbers(conversation):
            when = parse_locomo_date(conversation.get(f"session_{number}_date_time"))
            lines = []
            for turn in conversation[f"session_{number}"]:
                record = {
                    "role": "user",
                    "name": turn.get("speaker"),
                    "id": turn.get("dia_id"),
                    "content": turn_text(turn),
                }
                if when is not None:
                    record["created_at"] = when.isoformat()
                lines.append(json.dumps(record, ensure_ascii=False))
            (folder / f"session_{number}.jsonl").write_text("\n".join(lines) + "\n")
            counts["sessions"] += 1
            counts["turns"] += len(lines)
    return counts


def questions(files: list[Path]) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    """(conversation id, qa item, evidence turn ids) for categories 1–4.

    Evidence strings are normalised: 'D8:6; D9:17' holds two ids.
    """
    for path in files:
        data = json.loads(path.read_text())
        for item in data.get("qa", []):
            if item.get("category") not in CATEGORIES:
                continue
            evidence = sorted({m for e in item.get("evidence", []) for m in _EVIDENCE.findall(e)})
            if evidence:
                yield conversation_id(path), item, evidence


def ranked_turns(hits: list[Any], limit: int) -> list[str]:
    """Distinct turn ids in ranked order: each hit contributes all the turns it covers."""
    seen: list[str] = []
    for hit in hits:
        for turn_id in hit.turn_ids:
            if turn_id not in seen:
                seen.append(turn_id)
        if len(seen) >= limit:
            break
    return seen[:limit]


def evaluate_locomo(
    data: Path,
    *,
    ks: list[int] | None = None,
    store_dir: Path | None = None,
    settings: Settings | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Ingest every conversation in `data`, ask its questions, and report recall@k."""
    ks = sorted(ks or [1, 5, 10, 25])
    files = sorted(data.glob("*.json")) if data.is_dir() else [data]
    if not files:
        raise FileNotFoundError(f"no LoCoMo conversation files (*.json) in {data}")
    with tempfile.TemporaryDirectory(prefix="locomo-") as scratch:
        root = store_dir or Path(scratch)
        workspace = root / "workspace"
        shutil.rmtree(workspace, ignore_errors=True)  # a reused --store holds no stale sessions
        corpus = write_workspace(files, workspace)
        run_settings = (settings or Settings.load()).model_copy(
            update={
                "workspace": workspace,
                "db_path": root / "memory.duckdb",
                "index_dir": root / "index",
            }
        )
        started = time.perf_counter()
        run_first_stages(run_settings, progress=progress)
        ingest_seconds = time.perf_counter() - started

        searcher = Searcher(run_settings, None)
        searcher.search("warm up", k=1, min_score=0.0)
        per_question: list[dict[str, Any]] = []
        timings: list[float] = []
        for conversation, item, evidence in questions(files):
            begin = time.perf_counter()
            hits = searcher.search(
                item["question"],
                k=max(ks),
                filters=SearchFilters(conversation=conversation),
                min_score=0.0,
            )
            timings.append((time.perf_counter() - begin) * 1000)
            turns = ranked_turns(hits, max(ks))
            per_question.append(
                {
                    "conversation": conversation,
                    "category": item["category"],
                    "recall": {k: len(set(turns[:k]) & set(evidence)) / len(evidence) for k in ks},
                }
            )
    return _report(per_question, ks, corpus, ingest_seconds, timings)


def mean_recall(rows: list[dict[str, Any]], ks: list[int]) -> dict[str, float]:
    return {
        f"recall@{k}": round(statistics.fmean(r["recall"][k] for r in rows), 4) if rows else 0.0
        for k in ks
    }


def _report(
    rows: list[dict[str, Any]],
    ks: list[int],
    corpus: dict[str, int],
    ingest_seconds: float,
    timings: list[float],
) -> dict[str, Any]:
    by_category = {}
    for number, name in CATEGORIES.items():
        subset = [r for r in rows if r["category"] == number]
        by_category[name] = {**mean_recall(subset, ks), "questions": len(subset)}
    by_conversation = {}
    for conversation in sorted({r["conversation"] for r in rows}):
        subset = [r for r in rows if r["conversation"] == conversation]
        by_conversation[conversation] = {**mean_recall(subset, ks), "questions": len(subset)}
    ordered = sorted(timings)
    return {
        "overall": mean_recall(rows, ks),
        "by_category": by_category,
        "by_conversation": by_conversation,
        "questions": len(rows),
        "corpus": corpus,
        "ingest_seconds": round(ingest_seconds, 2),
        "query_ms_p50": round(statistics.median(ordered), 3) if ordered else 0.0,
        "query_ms_p95": round(ordered[int(0.95 * (len(ordered) - 1))], 3) if ordered else 0.0,
    }


def format_report(report: dict[str, Any]) -> str:
    ks = list(report["overall"])
    header = f"{'':<14}" + "".join(f"{k:>11}" for k in ks) + f"{'questions':>11}"
    lines = [header]
    lines.append(
        f"{'overall':<14}"
        + "".join(f"{report['overall'][k]:>11.3f}" for k in ks)
        + f"{report['questions']:>11}"
    )
    for name, values in report["by_category"].items():
        lines.append(
            f"{name:<14}"
            + "".join(f"{values[k]:>11.3f}" for k in ks)
            + f"{values['questions']:>11}"
        )
    corpus = report["corpus"]
    lines.append(
        f"\n{corpus['conversations']} conversations, {corpus['sessions']} sessions, "
        f"{corpus['turns']} turns; ingest {report['ingest_seconds']}s; "
        f"query p50 {report['query_ms_p50']} ms, p95 {report['query_ms_p95']} ms"
    )
    return "\n".join(lines)
