"""Relation edges written to a real store: a triple already there is skipped, never doubled."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from memory_dag.memories.relations import RELATED_TO, FactSet, write_edges
from memory_dag.store.connection import open_store


def edge(edge_id: str, from_id: str, to_id: str) -> dict[str, object]:
    return {
        "id": edge_id,
        "from_id": from_id,
        "to_id": to_id,
        "relation_type": RELATED_TO,
        "strength": 0.8,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }


def test_write_edges_skips_a_triple_already_stored_and_keeps_the_first(tmp_path: Path) -> None:
    with open_store(tmp_path / "memory.duckdb") as con:
        first = [edge("rel_a", "fact_1", "fact_0"), edge("rel_b", "fact_2", "fact_0")]
        assert write_edges(con, first) == 2
        # The same (from, to, type) under new ids, beside one new triple: only that one is added.
        again = [edge("rel_c", "fact_1", "fact_0"), edge("rel_d", "fact_2", "fact_1")]
        assert write_edges(con, again) == 1
        stored = con.execute("SELECT id, from_id, to_id FROM relations ORDER BY id").fetchall()
    assert stored == [
        ("rel_a", "fact_1", "fact_0"),
        ("rel_b", "fact_2", "fact_0"),
        ("rel_d", "fact_2", "fact_1"),
    ]


def test_a_fact_set_keeps_every_vector_as_it_grows_and_shrinks() -> None:
    """Facts go into a buffer that doubles; rows handed out before a removal keep their
    vectors (a reconciliation holds its neighbours' rows while facts are deleted)."""
    rng = np.random.default_rng(3)
    vectors = {f"f{i}": rng.random(8, dtype=np.float32) for i in range(40)}
    facts = FactSet(["f0", "f1"], ["t0", "t1"], np.stack([vectors["f0"], vectors["f1"]]))
    for i in range(2, 40):
        facts.add(f"f{i}", f"t{i}", vectors[f"f{i}"])
    assert facts.vectors.shape == (40, 8)
    handed_out = facts.vectors[10:13]
    expected = handed_out.copy()
    for gone in ("f3", "f11", "f39"):
        facts.remove(gone)
        del vectors[gone]
    assert np.array_equal(handed_out, expected)
    assert facts.ids == list(vectors)
    assert np.array_equal(facts.vectors, np.stack(list(vectors.values())))
    facts.add("new", "t", np.ones(8, dtype=np.float32))
    assert np.array_equal(facts.vector("new"), np.ones(8, dtype=np.float32))
    assert np.array_equal(facts.vector("f12"), vectors["f12"])
