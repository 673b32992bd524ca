"""Relation edges written to a real store: a triple already there is skipped, never doubled."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from memory_dag.memories.relations import RELATED_TO, write_edges
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
