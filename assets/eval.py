"""Evaluation assets (`memory_dag/eval/`): the nightly retrieval evaluation.

`retrieval_evaluation` ingests the configured evaluation set (LoCoMo-format conversation files;
`data` in the run config, else `MEMORY_DAG_EVAL_DATA`) into a scratch store of its own, asks
every question through each cumulative stage of the read path (`memory_dag.eval.stages`) and
records recall per stage and question category. Its checks compare recall@10 and recall@5 of
`eval_stages.EVAL_PROFILE` (the defaults with recency off: LoCoMo is not recency-biased) with
floors, so a regression shows as a failed check in the UI.
"""

import os
from pathlib import Path

import dagster as dg

from assets.resources import MemoryStoreResource
from schedules.crons import cron_schedule

EVAL_DATA_ENV = "MEMORY_DAG_EVAL_DATA"
KS = [1, 5, 10, 25]


class EvaluationConfig(dg.Config):
    """Where the evaluation set is and the least recall the defaults must keep."""

    data: str = ""  # empty: $MEMORY_DAG_EVAL_DATA
    recall_at_10_floor: float = 0.75
    recall_at_5_floor: float = 0.65
    reranker_model: str | None = None


@dg.asset(
    group_name="retrieval",
    kinds={"python"},
    check_specs=[
        dg.AssetCheckSpec("recall_at_10_above_floor", asset="retrieval_evaluation"),
        dg.AssetCheckSpec("recall_at_5_above_floor", asset="retrieval_evaluation"),
    ],
)
def retrieval_evaluation(
    context: dg.AssetExecutionContext, config: EvaluationConfig, memory: MemoryStoreResource
) -> dg.MaterializeResult:
    """Turn-level recall@k per read-path stage and question category on the evaluation set."""
    from memory_dag.eval.stages import EVAL_PROFILE, evaluate_stages, format_stage_report

    data = config.data or os.environ.get(EVAL_DATA_ENV, "")
    if not data:
        raise dg.Failure(f"no evaluation set: set `data` in the run config or {EVAL_DATA_ENV}")
    report = evaluate_stages(
        Path(data), ks=KS, settings=memory.settings(), reranker_model=config.reranker_model
    )
    table = format_stage_report(report)
    context.log.info("\n" + table)
    profile = report["variants"][EVAL_PROFILE]["overall"]
    metadata: dict[str, object] = {
        key: dg.MetadataValue.float(value) for key, value in profile.items()
    }
    metadata["profile"] = dg.MetadataValue.text(EVAL_PROFILE)
    metadata["questions"] = dg.MetadataValue.int(report["questions"])
    metadata["stages"] = dg.MetadataValue.md(f"```\n{table}\n```")
    checks = [
        _floor_check("recall_at_10_above_floor", profile["recall@10"], config.recall_at_10_floor),
        _floor_check("recall_at_5_above_floor", profile["recall@5"], config.recall_at_5_floor),
    ]
    return dg.MaterializeResult(metadata=metadata, check_results=checks)


def _floor_check(name: str, value: float, floor: float) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=name,
        passed=value >= floor,
        metadata={"recall": dg.MetadataValue.float(value), "floor": dg.MetadataValue.float(floor)},
    )


retrieval_evaluation_job = dg.define_asset_job(
    "retrieval_evaluation_job",
    selection=dg.AssetSelection.assets(retrieval_evaluation),
    description="Recall of the read path, per stage, on the configured evaluation set.",
)
retrieval_evaluation_schedule = cron_schedule(
    "retrieval_evaluation",
    retrieval_evaluation_job,
    "Nightly retrieval evaluation: a failed check means recall fell below a floor.",
)
EVAL_ASSETS = [retrieval_evaluation]
EVAL_JOBS = [retrieval_evaluation_job]
EVAL_SCHEDULES = [retrieval_evaluation_schedule]
