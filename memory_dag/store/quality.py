"""Data-quality checks on the store, written as Great Expectations 1.x suites.

Each check pulls a small frame through a short store connection (GX's own SQL source would
open a second connection to the locked DuckDB file) and validates it with an ephemeral GX
context. The Dagster asset checks in `assets/checks.py` call these; so can anyone else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_dag.config import Settings
from memory_dag.index.published import read_manifest
from memory_dag.store.connection import get_meta, open_store


@dataclass
class CheckOutcome:
    passed: bool
    failures: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _validate(frame: Any, expectations: list[Any]) -> CheckOutcome:
    """Run `expectations` on a pandas frame; failures name the expectation and its numbers."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("memory_dag")
    asset = source.add_dataframe_asset("frame")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(
        batch_parameters={"dataframe": frame}
    )
    suite = gx.ExpectationSuite(name="memory_dag_check")
    for expectation in expectations:
        suite.add_expectation(expectation)
    result = batch.validate(suite)
    failures = []
    for item in result.results:
        if not item.success:
            config = item.expectation_config
            observed = {
                k: v
                for k, v in (item.result or {}).items()
                if k in ("unexpected_count", "observed_value", "partial_unexpected_list")
            }
            kwargs = config.kwargs
            columns = kwargs.get("column") or f"{kwargs.get('column_A')}/{kwargs.get('column_B')}"
            failures.append(f"{config.type} {columns} {observed}")
    return CheckOutcome(bool(result.success), failures, {"rows": len(frame)})


def check_chunks(settings: Settings) -> CheckOutcome:
    """Unique ids, no empty text, valid line ranges, no chunk of a file that is gone."""
    import great_expectations as gx

    with open_store(settings.db_path) as con:
        frame = con.execute(
            """
            SELECT c.id, c.text, c.start_line, c.end_line, c.path,
                   (f.path IS NOT NULL) AS file_known
            FROM chunks c LEFT JOIN files f ON f.path = c.path
            """
        ).df()
    workspace = Path(settings.workspace)
    frame["file_exists"] = [(workspace / p).exists() for p in frame["path"]]
    return _validate(
        frame,
        [
            gx.expectations.ExpectColumnValuesToBeUnique(column="id"),
            gx.expectations.ExpectColumnValuesToNotBeNull(column="text"),
            gx.expectations.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1),
            gx.expectations.ExpectColumnValuesToBeBetween(column="start_line", min_value=1),
            gx.expectations.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="end_line", column_B="start_line", or_equal=True
            ),
            gx.expectations.ExpectColumnValuesToBeInSet(column="file_known", value_set=[True]),
            gx.expectations.ExpectColumnValuesToBeInSet(column="file_exists", value_set=[True]),
        ],
    )


def check_embeddings(settings: Settings) -> CheckOutcome:
    """Every search document has a vector of the recorded model with the recorded dimensions."""
    import great_expectations as gx

    with open_store(settings.db_path) as con:
        provider = get_meta(con, "embedding_provider")
        model = get_meta(con, "embedding_model")
        dims = int(get_meta(con, "embedding_dims") or 0)
        frame = con.execute(
            """
            SELECT c.id, e.dims, len(e.embedding) AS length
            FROM search_documents c LEFT JOIN embedding_cache e
              ON e.provider = ? AND e.model = ? AND e.hash = c.hash
            """,
            [provider, model],
        ).df()
    outcome = _validate(
        frame,
        [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="dims"),
            gx.expectations.ExpectColumnValuesToBeInSet(column="dims", value_set=[dims]),
            gx.expectations.ExpectColumnValuesToBeInSet(column="length", value_set=[dims]),
        ],
    )
    outcome.details.update({"model": f"{provider}/{model}", "dims": dims})
    return outcome


def check_search_index(settings: Settings) -> CheckOutcome:
    """The published FAISS index holds exactly one vector per embedded search document."""
    import faiss
    import great_expectations as gx
    import pandas as pd

    manifest = read_manifest(Path(settings.index_dir))
    if manifest is None:
        return CheckOutcome(False, ["no search index has been published"])
    folder = Path(settings.index_dir) / manifest["version"]
    faiss_path = folder / "vectors.faiss"
    faiss_count = faiss.read_index(str(faiss_path)).ntotal if faiss_path.exists() else 0
    with open_store(settings.db_path) as con:
        embedded = con.execute(
            """
            SELECT count(*) FROM search_documents c JOIN embedding_cache e
              ON e.provider = ? AND e.model = ? AND e.hash = c.hash
            """,
            [manifest["provider"], manifest["model"]],
        ).fetchone()[0]
    frame = pd.DataFrame(
        [{"faiss_count": faiss_count, "embedded_chunks": embedded, "rows": manifest["count"]}]
    )
    outcome = _validate(
        frame,
        [
            gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A="faiss_count", column_B="embedded_chunks"
            ),
            gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A="rows", column_B="embedded_chunks"
            ),
        ],
    )
    outcome.details.update(
        {"faiss_count": faiss_count, "embedded_chunks": embedded, "version": manifest["version"]}
    )
    return outcome
