"""The store's signals with live writes on top (`with_live_writes`) read as the merged dicts
they were before they became views: same keys, same order, same values."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_dag.index.delta import Overlay
from memory_dag.read.store_signals import StoreSignals, with_live_writes

EPISODES = [f"ep{i}" for i in range(6)]
FACTS = [f"f{i}" for i in range(6)]


def merged(snapshot: StoreSignals, overlay: Overlay) -> tuple[dict, dict, set]:
    """`with_live_writes` as it was (verbatim but for its return)."""
    superseded = {
        episode: by
        for episode, by in snapshot.superseded.items()
        if episode not in overlay.released
    }
    superseded.update(overlay.superseded)
    facts_of = {
        episode: [fact for fact in facts if fact not in overlay.dead]
        for episode, facts in snapshot.facts_of.items()
    }
    for episode, facts in overlay.facts_of.items():
        known = facts_of.setdefault(episode, [])
        known.extend(fact for fact in facts if fact not in known)
    return superseded, facts_of, (snapshot.dead | overlay.dead) - overlay.alive


by_st = st.none() | st.sampled_from(FACTS)
facts_st = st.lists(st.sampled_from(FACTS), max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    stored_superseded=st.dictionaries(st.sampled_from(EPISODES), by_st),
    stored_facts=st.dictionaries(st.sampled_from(EPISODES), facts_st),
    stored_dead=st.sets(st.sampled_from(FACTS)),
    live_superseded=st.dictionaries(st.sampled_from(EPISODES), by_st),
    live_facts=st.dictionaries(st.sampled_from(EPISODES), facts_st),
    released=st.sets(st.sampled_from(EPISODES)),
    dead=st.sets(st.sampled_from(FACTS)),
    alive=st.sets(st.sampled_from(FACTS)),
)
def test_live_signals_read_as_the_merged_dicts(
    stored_superseded: dict[str, str | None],
    stored_facts: dict[str, list[str]],
    stored_dead: set[str],
    live_superseded: dict[str, str | None],
    live_facts: dict[str, list[str]],
    released: set[str],
    dead: set[str],
    alive: set[str],
) -> None:
    snapshot = StoreSignals(dead=stored_dead, superseded=stored_superseded, facts_of=stored_facts)
    overlay = Overlay(
        superseded=live_superseded, facts_of=live_facts, released=released, dead=dead, alive=alive
    )
    superseded, facts_of, dead_ids = merged(snapshot, overlay)
    signals = with_live_writes(snapshot, overlay)
    assert list(signals.superseded.items()) == list(superseded.items())
    assert list(signals.facts_of.items()) == list(facts_of.items())
    assert len(signals.superseded) == len(superseded) and len(signals.facts_of) == len(facts_of)
    for episode in [*EPISODES, "unknown"]:  # lookups, as the retriever makes them
        assert (episode in signals.superseded) == (episode in superseded)
        assert signals.superseded.get(episode, "none") == superseded.get(episode, "none")
        assert signals.facts_of.get(episode, []) == facts_of.get(episode, [])
        assert (episode in signals.facts_of) == (episode in facts_of)
    assert signals.dead == dead_ids
    assert signals.entity_matches == {}


def test_a_released_episode_is_no_longer_superseded_unless_a_live_write_says_so() -> None:
    snapshot = StoreSignals(superseded={"ep1": "f1", "ep2": None}, facts_of={"ep1": ["f1", "f2"]})
    overlay = Overlay(superseded={"ep2": "f9"}, released={"ep1", "ep2"}, dead={"f1"})
    signals = with_live_writes(snapshot, overlay)
    assert "ep1" not in signals.superseded and signals.superseded["ep2"] == "f9"
    assert signals.facts_of["ep1"] == ["f2"]
