"""Asset checks (Great Expectations' expectations as SQL, `memory_dag.store.quality`), in the UI.

The chunk and embedding checks are blocking: a broken chunk table or a mixed-dimension
embedding set must not be published into the search index.
"""

from typing import TYPE_CHECKING

import dagster as dg

from assets.embed import chunk_embeddings
from assets.index import SEARCH_INDEX
from assets.ingest import chunks
from assets.resources import MemoryStoreResource

if TYPE_CHECKING:  # the checks read the published index (FAISS): imported when they run
    from memory_dag.store import quality


def _result(outcome: "quality.CheckOutcome") -> dg.AssetCheckResult:
    metadata = {key: str(value) for key, value in outcome.details.items()}
    if outcome.failures:
        metadata["failures"] = dg.MetadataValue.md(
            "\n".join(f"- {failure}" for failure in outcome.failures)
        )
    return dg.AssetCheckResult(passed=outcome.passed, metadata=metadata)


@dg.asset_check(asset=chunks, blocking=True, pool="duckdb")
def chunks_are_valid(memory: MemoryStoreResource) -> dg.AssetCheckResult:
    """Unique ids, no empty text, valid line ranges, no rows of deleted files."""
    from memory_dag.store import quality

    return _result(quality.check_chunks(memory.settings()))


@dg.asset_check(asset=chunk_embeddings, blocking=True, pool="duckdb")
def every_chunk_embedded(memory: MemoryStoreResource) -> dg.AssetCheckResult:
    """Every chunk and indexed memory embedded by the recorded model, with the recorded dims."""
    from memory_dag.store import quality

    return _result(quality.check_embeddings(memory.settings()))


@dg.asset_check(asset=SEARCH_INDEX, pool="duckdb")
def index_matches_embeddings(memory: MemoryStoreResource) -> dg.AssetCheckResult:
    """The FAISS file's count equals the number of embedded search documents."""
    from memory_dag.store import quality

    return _result(quality.check_search_index(memory.settings()))


INGEST_CHECKS = [chunks_are_valid, every_chunk_embedded, index_matches_embeddings]
