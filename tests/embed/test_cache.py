"""The embedding cache over a real store: a text's stored vector is what `embed` hands back, a
text not stored is embedded and written, and a key is looked up only under its own model."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.embed.cache import VectorCache
from memory_dag.embed.providers import get_provider
from memory_dag.ids import text_hash
from memory_dag.store.connection import insert_arrow, open_store


def test_embed_hands_back_the_stored_vector_and_embeds_only_what_is_missing(
    tmp_path: Path,
) -> None:
    settings = Settings(db_path=tmp_path / "memory.duckdb")
    provider = get_provider(settings)
    marked = np.full(provider.dims, 0.5, dtype=np.float32)  # no model would give this vector
    stored = {"Sam likes sailing.": provider.name, "Anne likes tea.": "another-provider"}
    with open_store(settings.db_path) as con:
        insert_arrow(
            con,
            "embedding_cache",
            pa.table(
                {
                    "provider": list(stored.values()),
                    "model": [provider.model] * len(stored),
                    "hash": [text_hash(text) for text in stored],
                    "dims": pa.array([provider.dims] * len(stored), pa.int32()),
                    "embedding": [marked.tolist()] * len(stored),
                    "created_at": [datetime(2026, 1, 1, tzinfo=UTC)] * len(stored),
                }
            ),
        )
        texts = ["Sam likes sailing.", "Anne likes tea.", "Jo likes chess."]
        vectors = VectorCache(con, provider).embed(texts, defer=False)
        written = con.execute(
            "SELECT count(*) FROM embedding_cache WHERE provider = ? AND model = ?",
            [provider.name, provider.model],
        ).fetchone()[0]
    assert np.array_equal(vectors[0], marked)  # from the cache
    for fresh in (vectors[1], vectors[2]):  # another provider's row is not this model's vector
        assert not np.allclose(fresh, marked)
        assert np.allclose(np.linalg.norm(fresh), 1.0, atol=1e-3)
    assert written == 3  # the stored one and the two embedded now


def test_a_text_asked_for_again_is_its_first_vector_and_a_copy(tmp_path: Path) -> None:
    """The writer asks for a fact's vector several times: the later answers are the first one
    (without embedding or hashing again), and each answer is the caller's own array."""
    settings = Settings(db_path=tmp_path / "memory.duckdb")
    provider = get_provider(settings)
    with open_store(settings.db_path) as con:
        cache = VectorCache(con, provider)
        first = cache.embed(["Sam likes sailing.", "Jo likes chess."], defer=True)
        first_copy = first.copy()
        first[:] = 0.0  # a caller writing into its answer must not reach the cache
        again = cache.embed(
            ["Jo likes chess.", "Sam likes sailing.", "Jo likes chess."], defer=True
        )
        assert np.array_equal(again, first_copy[[1, 0, 1]])
        again[:] = 0.0
        one = cache.embed(["Jo likes chess."], defer=True)
        one[:] = 0.0
        assert np.array_equal(cache.embed(["Jo likes chess."], defer=True)[0], first_copy[1])
        cache.reset()  # forgotten after a rollback: looked up or embedded again
        assert np.allclose(cache.embed(["Jo likes chess."], defer=True)[0], first_copy[1])
