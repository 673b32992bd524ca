"""The embedding check (`quality.check_embeddings`, the blocking `every_chunk_embedded` asset
check): every search document has a vector of the recorded model, of the recorded size."""

from __future__ import annotations

import duckdb
import pytest

from memory_dag.config import Settings
from memory_dag.pipeline import run_first_stages
from memory_dag.store.quality import check_embeddings


@pytest.fixture
def embedded(settings: Settings) -> Settings:
    run_first_stages(settings)
    return settings


def _one_vector(settings: Settings, statement: str) -> None:
    """Run `statement` on the embedding of one search document (`?`: its hash)."""
    with duckdb.connect(str(settings.db_path)) as con:
        (hash_,) = con.execute("SELECT hash FROM search_documents ORDER BY id LIMIT 1").fetchone()
        con.execute(statement, [hash_])


def test_a_fresh_store_passes(embedded: Settings) -> None:
    outcome = check_embeddings(embedded)
    assert outcome.passed, outcome.failures
    assert outcome.details["rows"] > 0 and outcome.details["dims"] == 256


@pytest.mark.parametrize(
    ("statement", "broken"),
    [
        ("DELETE FROM embedding_cache WHERE hash = ?", "to_not_be_null dims"),
        (
            "UPDATE embedding_cache SET embedding = embedding[1:255] WHERE hash = ?",
            "to_be_in_set length",
        ),
        ("UPDATE embedding_cache SET dims = 128 WHERE hash = ?", "to_be_in_set dims"),
    ],
)
def test_one_missing_or_misshapen_vector_fails_it(
    embedded: Settings, statement: str, broken: str
) -> None:
    _one_vector(embedded, statement)
    outcome = check_embeddings(embedded)
    assert not outcome.passed
    assert len(outcome.failures) == 1 and broken in outcome.failures[0]
    assert "'unexpected_count': 1" in outcome.failures[0]
