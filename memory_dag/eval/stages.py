"""The LoCoMo evaluation per retrieval stage: what each stage of `read/retriever.py` adds or costs.

The corpus is ingested once (as `memory-dag eval locomo` does, with its workspace writer,
questions and turn-level recall), then every question is asked through the retrieval
pipeline with the stages switched on one after another:

    fusion only      the search's fused ranking (no stage)
    + rerank         cross-encoder relevance (only when a model is given)
    + threshold      relevance < score_threshold pruned
    + recency        (1 − w)·relevance + w·exp(−age/30); "now" is the conversation's last turn,
                     as for an agent answering right after it
    + store signals  liveness, relation boost, insight weight
    + mmr (defaults) diversity: every stage on, as `RetrievalConfig()` has them

and two more: the defaults with mmr off, and with recency off (`EVAL_PROFILE`, what the
nightly asset checks against its recall floors: see that constant for why).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from memory_dag.config import Settings
from memory_dag.eval.locomo import (
    CATEGORIES,
    mean_recall,
    questions,
    ranked_turns,
    write_workspace,
)
from memory_dag.index.search import Searcher, SearchFilters
from memory_dag.pipeline import run_first_stages
from memory_dag.read.retriever import RetrievalConfig, Retriever

#: The last cumulative step: every stage on, as `RetrievalConfig()` has them.
DEFAULTS = "+ mmr (defaults)"
#: What the recall floors are checked on: the defaults with recency off. LoCoMo asks about any
#: point of conversations that span months, where recency costs recall (w = 0.2: recall@10
#: 0.80 → 0.39 on locomo-dev; even w = 0.05 costs 0.02); agents keep it for recent context.
EVAL_PROFILE = "defaults, recency off"
_OFF = dict(store_signals=False, rerank=False, threshold=False, recency=False, relations=False,
            entities=False, insight=False, mmr=False, track_access=False)  # fmt: skip


def stage_variants(reranker_model: str | None = None) -> dict[str, RetrievalConfig]:
    """Cumulative stage settings, from the fused ranking alone to the embedded defaults."""
    steps: list[tuple[str, dict[str, Any]]] = [("fusion only", {})]
    if reranker_model:
        steps.append(("+ rerank", {"rerank": True, "reranker_model": reranker_model}))
    steps += [
        ("+ threshold", {"threshold": True}),
        ("+ recency", {"recency": True}),
        (
            "+ store signals",
            {"store_signals": True, "relations": True, "entities": True, "insight": True},
        ),  # fmt: skip
        (DEFAULTS, {"mmr": True}),
    ]
    variants: dict[str, RetrievalConfig] = {}
    current: dict[str, Any] = dict(_OFF)
    for name, change in steps:
        current = {**current, **change}
        variants[name] = RetrievalConfig(**current)
    defaults = variants[DEFAULTS]
    variants["defaults, mmr off"] = defaults.model_copy(update={"mmr": False})
    variants[EVAL_PROFILE] = defaults.model_copy(update={"recency": False})
    return variants


def evaluate_stages(
    data: Path,
    *,
    ks: list[int] | None = None,
    store_dir: Path | None = None,
    settings: Settings | None = None,
    reranker_model: str | None = None,
    variants: dict[str, RetrievalConfig] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Recall@k overall and per question category for each variant of the stages."""
    ks = sorted(ks or [1, 5, 10, 25])
    files = sorted(data.glob("*.json")) if data.is_dir() else [data]
    if not files:
        raise FileNotFoundError(f"no LoCoMo conversation files (*.json) in {data}")
    variants = variants or stage_variants(reranker_model)
    with tempfile.TemporaryDirectory(prefix="locomo-stages-") as scratch:
        root = store_dir or Path(scratch)
        corpus = write_workspace(files, root / "workspace")
        run_settings = (settings or Settings.load()).model_copy(
            update={
                "workspace": root / "workspace",
                "db_path": root / "memory.duckdb",
                "index_dir": root / "index",
            }
        )
        run_first_stages(run_settings, progress=progress)
        searcher = Searcher(run_settings)
        asked = list(questions(files))
        latest = _last_turn_times(searcher)
        report: dict[str, Any] = {"variants": {}, "questions": len(asked), "corpus": corpus}
        for name, config in variants.items():
            retriever = Retriever(run_settings, config, searcher=searcher)
            report["variants"][name] = _run(retriever, asked, latest, ks)
    return report


def _last_turn_times(searcher: Searcher) -> dict[str, datetime]:
    """Each conversation's latest event time in the index: "now" for the recency stage."""
    latest: dict[str, datetime] = {}
    rows = searcher.index.rows
    for conversation, when in zip(rows["conversation_id"], rows["event_time"], strict=True):
        if conversation is None or when is None:
            continue
        if conversation not in latest or when > latest[conversation]:
            latest[conversation] = when
    return latest


def _run(
    retriever: Retriever,
    asked: list[tuple[str, dict[str, Any], list[str]]],
    latest: dict[str, datetime],
    ks: list[int],
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    timings: list[float] = []
    stages: set[str] = set()
    for conversation, item, evidence in asked:
        started = time.perf_counter()
        result = retriever.retrieve(
            item["question"],
            top_k=max(ks),
            filters=SearchFilters(conversation=conversation),
            now=latest.get(conversation),
        )
        timings.append((time.perf_counter() - started) * 1000)
        stages.update(result.ran())
        turns = ranked_turns([c.hit for c in result.items], max(ks))
        rows.append(
            {
                "category": item["category"],
                "recall": {k: len(set(turns[:k]) & set(evidence)) / len(evidence) for k in ks},
            }
        )
    by_category = {
        name: mean_recall([r for r in rows if r["category"] == number], ks)
        for number, name in CATEGORIES.items()
    }
    return {
        "overall": mean_recall(rows, ks),
        "by_category": by_category,
        "stages": sorted(stages),
        "query_ms_p50": round(statistics.median(timings), 2) if timings else 0.0,
    }


def format_stage_report(report: dict[str, Any]) -> str:
    """One row per variant (overall recall@k), then recall@10 per question category."""
    variants = report["variants"]
    first = next(iter(variants.values()))
    ks = list(first["overall"])
    width = max(len(name) for name in variants) + 2
    lines = [f"{'':<{width}}" + "".join(f"{k:>11}" for k in ks) + f"{'p50 ms':>9}"]
    for name, values in variants.items():
        recalls = "".join(f"{values['overall'][k]:>11.3f}" for k in ks)
        lines.append(f"{name:<{width}}{recalls}{values['query_ms_p50']:>9.1f}")
    focus = "recall@10" if "recall@10" in ks else ks[-1]
    categories = list(first["by_category"])
    lines.append(f"\n{focus} by category")
    lines.append(f"{'':<{width}}" + "".join(f"{c:>13}" for c in categories))
    for name, values in variants.items():
        cells = "".join(f"{values['by_category'][c][focus]:>13.3f}" for c in categories)
        lines.append(f"{name:<{width}}{cells}")
    lines.append(f"\n{report['questions']} questions")
    return "\n".join(lines)
