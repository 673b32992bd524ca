"""Entity resolution with its memo of mentions said before: on any sequence of mentions, the same
entities, aliases and types as resolving every mention anew."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_dag.memories.entities import EntityMention
from memory_dag.memories.entity_links import TYPE_UPGRADE_CONFIDENCE, EntityLinker
from memory_dag.store.connection import open_store

# Few names, spelt several ways, with compatible and incompatible types and both confidences:
# the draws hit new entities, aliases, type upgrades and the memo's hits in one sequence.
TEXTS = ["Anne", "anne", " Anne ", "Sam", "Dr. Sam", "Paris", "#paris", "Sam  Lee"]
CANONICALS = ["Anne", "Sam", "Paris", "paris", "Sam Lee"]
TYPES = ["person", "location", "other", "hashtag", "organization"]
CONFIDENCES = [0.5, TYPE_UPGRADE_CONFIDENCE]

mentions = st.lists(
    st.builds(
        lambda text, canonical, kind, confidence: EntityMention(
            text, canonical, kind, 0, len(text), confidence, "regex"
        ),
        st.sampled_from(TEXTS),
        st.sampled_from(CANONICALS),
        st.sampled_from(TYPES),
        st.sampled_from(CONFIDENCES),
    ),
    max_size=40,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    with open_store(tmp_path_factory.mktemp("entities") / "memory.duckdb") as con:
        yield con  # an empty `entities` table: nothing is flushed


def resolved_in_order(linker: EntityLinker, said: list[EntityMention], memo: bool) -> list[object]:
    """Each mention's entity as its creation rank, then every entity's name, type and aliases."""
    ranks: dict[str, int] = {}
    picks = []
    for mention in said:
        if memo:
            entity = linker._resolve_entity(mention)
        else:
            entity, _ = linker._resolve_uncached(mention, linker._load_entities())
        picks.append(ranks.setdefault(entity.id, len(ranks)))
    entities = sorted(linker._load_entities().values(), key=lambda e: ranks[e.id])
    return [picks, [(e.canonical_name, e.type, e.aliases) for e in entities]]


@settings(max_examples=300, deadline=None)
@given(said=mentions)
def test_the_memo_resolves_every_sequence_as_resolving_anew(
    store: duckdb.DuckDBPyConnection, said: list[EntityMention]
) -> None:
    def count(key: str, amount: int) -> None:
        return None

    def run(memo: bool) -> list[object]:
        # Each run makes its entities with new random ids: the picks must not depend on them.
        return resolved_in_order(EntityLinker(store, count), said, memo=memo)

    assert run(memo=True) == run(memo=False)


def test_a_strong_cue_retypes_a_bare_name_the_memo_saw_before(
    store: duckdb.DuckDBPyConnection,
) -> None:
    linker = EntityLinker(store, lambda key, amount: None)
    bare = EntityMention("Anne", "Anne", "other", 0, 4, 0.5, "regex")
    weak = EntityMention("Anne", "Anne", "person", 0, 4, 0.5, "regex")
    strong = EntityMention("Anne", "Anne", "person", 0, 4, TYPE_UPGRADE_CONFIDENCE, "regex")
    first = linker._resolve_entity(bare)
    # A weak cue leaves the bare name as it is, and the memo keeps that answer for weak cues...
    assert linker._resolve_entity(weak) is first and first.type == "other"
    assert linker._resolve_entity(weak) is first and first.type == "other"
    # ...not for a strong one, which retypes it.
    assert linker._resolve_entity(strong) is first and first.type == "person"
    assert linker._resolve_entity(bare) is first
