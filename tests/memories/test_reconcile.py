"""Reconciliation (seed 000 §4.3/§5.2, seed 004 two-level dedup): bands, structure and the LLM."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from memory_dag.llm import LLMClient, LLMConfig
from memory_dag.memories.entities import extract_entities
from memory_dag.memories.fact_rules import extract_facts_rules
from memory_dag.memories.reconcile import (
    Decision,
    ExistingMemory,
    SimilarityBands,
    dedup_batch,
    is_near_duplicate,
    jaccard,
    jaccard_to_each,
    reconcile_llm,
    reconcile_rules,
)
from tests.openai_server import Reply, ScriptedOpenAIServer

BASE = np.array([1.0, 0.0])


def at_cosine(cos: float) -> np.ndarray:
    """A unit vector whose cosine with BASE is `cos`."""
    return np.array([cos, math.sqrt(1.0 - cos * cos)])


def events(decisions: list[Decision]) -> list[tuple[str, str | None, str]]:
    return [(d.event, d.memory_id, d.text) for d in decisions]


# --------------------------------------------------------------------------- text helpers


def test_dedup_batch_removes_normalised_duplicates_in_order() -> None:
    batch = [
        "The user loves pizza.",
        "The user lives in Paris.",
        "the user  loves PIZZA",
        "The user loves pizza!",
    ]
    assert dedup_batch(batch) == ["The user loves pizza.", "The user lives in Paris."]


def test_jaccard_on_word_sets() -> None:
    assert jaccard("The user loves pizza.", "the user hates PIZZA") == pytest.approx(3 / 5)
    assert jaccard("pizza", "pizza pizza") == 1.0
    assert jaccard("", "") == 1.0
    assert jaccard("pizza", "") == 0.0


def test_near_duplicate_threshold_is_inclusive() -> None:
    assert is_near_duplicate("a b c", ["x", "a b c d"])  # 3/4 = 0.75
    assert not is_near_duplicate("a b c", ["a b c d e"])  # 3/5
    assert not is_near_duplicate("a b c", [])


# --------------------------------------------------------------------------- bands (unparsed facts)

HIKE_OLD = "Caroline hiked up a mountain with Melanie last weekend."
HIKE_NEW = "Caroline went hiking in the mountains with Mel."


def decide_one(new: str, old: str, cos: float | None) -> list[Decision]:
    vectors = None if cos is None else np.array([at_cosine(cos)])
    return reconcile_rules([new], vectors, [ExistingMemory("m1", old, BASE)])


def test_cosine_above_duplicate_band_is_none() -> None:
    [decision] = decide_one(HIKE_NEW, HIKE_OLD, 0.96)
    assert (decision.event, decision.memory_id, decision.text) == ("NONE", "m1", HIKE_OLD)
    assert decision.similarity == pytest.approx(0.96)
    assert decision.fact_index == 0


def test_cosine_in_update_band_with_same_subject_is_update() -> None:
    [decision] = decide_one(HIKE_NEW, HIKE_OLD, 0.85)
    assert (decision.event, decision.memory_id, decision.text) == ("UPDATE", "m1", HIKE_NEW)


def test_update_band_edges() -> None:
    assert [d.event for d in decide_one(HIKE_NEW, HIKE_OLD, 0.81)] == ["UPDATE"]
    assert [d.event for d in decide_one(HIKE_NEW, HIKE_OLD, 0.79)] == ["NONE", "ADD"]
    assert [d.event for d in decide_one(HIKE_NEW, HIKE_OLD, 0.94)] == ["UPDATE"]


def test_low_similarity_is_add_and_the_neighbour_untouched() -> None:
    assert events(decide_one(HIKE_NEW, HIKE_OLD, 0.5)) == [
        ("NONE", "m1", HIKE_OLD),
        ("ADD", None, HIKE_NEW),
    ]


def test_update_band_needs_the_same_subject() -> None:
    other = "Melanie went hiking in the mountains with Mel."
    assert [d.event for d in decide_one(other, HIKE_OLD, 0.85)] == ["NONE", "ADD"]


def test_jaccard_to_each_is_jaccard_with_each() -> None:
    others = ["the user hates PIZZA", "", "pizza pizza", "Sam lives in Paris.", "the user"]
    for text in ("The user loves pizza.", "", "pizza"):
        assert jaccard_to_each(text, others) == [jaccard(text, other) for other in others]
    assert jaccard_to_each("pizza", []) == []


def test_jaccard_duplicate_without_vectors() -> None:
    old = "Caroline went hiking in the mountains with Mel last weekend."
    assert [d.event for d in decide_one(HIKE_NEW, old, None)] == ["NONE"]


def test_custom_bands_are_used() -> None:
    strict = SimilarityBands(cosine_duplicate=0.99, cosine_update=0.97)
    decisions = reconcile_rules(
        [HIKE_NEW], np.array([at_cosine(0.96)]), [ExistingMemory("m1", HIKE_OLD, BASE)], strict
    )
    assert [d.event for d in decisions] == ["NONE", "ADD"]


def test_negation_only_difference_is_a_contradiction() -> None:
    old = "Caroline goes to the gym on Mondays."
    new = "Caroline no longer goes to the gym on Mondays."
    assert events(decide_one(new, old, None)) == [("DELETE", "m1", old), ("ADD", None, new)]


# --------------------------------------------------------------------------- structure


def test_contradiction_beats_high_cosine() -> None:
    # Embeddings barely see negation; the structure does.
    decisions = decide_one("The user now hates pizza.", "The user loves pizza.", 0.99)
    assert events(decisions) == [
        ("DELETE", "m1", "The user loves pizza."),
        ("ADD", None, "The user now hates pizza."),
    ]
    assert decisions[0].fact_index == 0


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("The user likes jazz.", "The user does not like jazz."),
        ("The user works at Google.", "The user quit Google."),
        ("The user is vegetarian.", "The user is no longer vegetarian."),
        ("Caroline is a fan of pottery.", "Caroline is not a fan of pottery."),
        ("The user started yoga.", "The user gave up yoga."),
    ],
)
def test_opposite_polarity_deletes_the_old_and_adds_the_new(old: str, new: str) -> None:
    assert events(decide_one(new, old, None)) == [("DELETE", "m1", old), ("ADD", None, new)]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("The user lives in Paris.", "The user lives in Berlin."),
        ("The user lives in Paris.", "The user moved to Berlin."),
        ("The user's favorite color is blue.", "The user's favorite color is red."),
        ("The user's wife is named Anne.", "The user's wife is named Anna."),
        ("The user works at Google.", "The user works at Acme."),
        ("The user is 31 years old.", "The user is 32 years old."),
        ("The user likes pizza.", "The user loves pizza."),
        ("The user loves pizza.", "The user loves pepperoni pizza."),
        ("The user has two kids.", "The user has three kids."),  # a new count
        ("Ola has 2 cats.", "Ola has three cats."),
    ],
)
def test_same_slot_new_value_updates(old: str, new: str) -> None:
    assert events(decide_one(new, old, None)) == [("UPDATE", "m1", new)]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("The user loves pizza.", "The user loves pasta."),
        ("The user's sister is named Anne.", "The user's sister is named Beth."),
        ("The user has a dog.", "The user has a cat."),
        ("The user has two dogs.", "The user has two cats."),
        ("Caroline loves pizza.", "Melanie hates pizza."),
    ],
)
def test_different_facts_coexist_even_when_embeddings_say_otherwise(old: str, new: str) -> None:
    assert events(decide_one(new, old, 0.99)) == [("NONE", "m1", old), ("ADD", None, new)]


def test_less_specific_new_fact_is_a_duplicate() -> None:
    decisions = decide_one("The user loves pizza.", "The user loves pepperoni pizza.", None)
    assert events(decisions) == [("NONE", "m1", "The user loves pepperoni pizza.")]


def test_full_enumeration_and_batch_dedup() -> None:
    pizza = ExistingMemory("m1", "The user loves pizza.", None)
    paris = ExistingMemory("m2", "The user lives in Paris.", None)
    kids = ExistingMemory("m3", "The user has two kids.", None)
    decisions = reconcile_rules(
        ["The user lives in Rome.", "The user has two kids.", "the user lives in rome"],
        None,
        [pizza, paris, kids, paris],  # a neighbour retrieved for two facts comes twice
    )
    assert events(decisions) == [
        ("NONE", "m1", "The user loves pizza."),
        ("UPDATE", "m2", "The user lives in Rome."),
        ("NONE", "m3", "The user has two kids."),
    ]
    assert [d.fact_index for d in decisions] == [None, 0, 1]


def test_no_neighbours_adds_everything() -> None:
    decisions = reconcile_rules(["The user loves pizza.", "The user has a cat."], None, [])
    assert events(decisions) == [
        ("ADD", None, "The user loves pizza."),
        ("ADD", None, "The user has a cat."),
    ]


def test_pizza_scenario_end_to_end_on_rules() -> None:
    [first] = extract_facts_rules("I love pizza", None, "t1")
    [added] = reconcile_rules([first.text], None, [])
    assert (added.event, added.text) == ("ADD", "The user loves pizza.")
    stored = [ExistingMemory("mem-1", added.text, None)]

    [second] = extract_facts_rules("I hate pizza now", None, "t2")
    decisions = reconcile_rules([second.text], None, stored)
    assert events(decisions) == [
        ("DELETE", "mem-1", "The user loves pizza."),
        ("ADD", None, "The user now hates pizza."),
    ]


def test_wife_scenario_gives_a_fact_and_a_person() -> None:
    turn = "my wife is Anne"
    [fact] = extract_facts_rules(turn, None, "t1")
    assert fact.text == "The user's wife is named Anne."
    assert [(m.type, m.canonical) for m in extract_entities(turn)] == [("person", "Anne")]
    assert [(m.type, m.canonical) for m in extract_entities(fact.text)] == [("person", "Anne")]


# --------------------------------------------------------------------------- LLM


def make_llm(server: ScriptedOpenAIServer, timeout: float = 5.0) -> LLMClient:
    config = LLMConfig(base_url=server.base_url, model="test-model", timeout=timeout, max_retries=0)
    return LLMClient(config)


PIZZA = ExistingMemory("mem-a", "The user loves pizza.", None)
PARIS = ExistingMemory("mem-b", "The user lives in Paris.", None)


def test_llm_decisions_are_mapped_back_to_real_ids(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(
        Reply.json(
            [
                {"id": 0, "text": "The user loves pizza.", "event": "DELETE"},
                {
                    "id": "1",
                    "text": "The user lives in Berlin.",
                    "event": "UPDATE",
                    "old_memory": "The user lives in Paris.",
                },
                {"id": "2", "text": "The user now hates pizza.", "event": "add"},
                {"id": "3", "text": "The user has a cat.", "event": "ADD"},
            ]
        )
    )
    new_facts = ["The user now hates pizza.", "The user lives in Berlin.", "The user has a cat."]
    decisions, error = reconcile_llm(make_llm(openai_server), new_facts, [PIZZA, PARIS])

    assert error is None
    assert events(decisions) == [
        ("DELETE", "mem-a", "The user loves pizza."),
        ("UPDATE", "mem-b", "The user lives in Berlin."),
        ("ADD", None, "The user now hates pizza."),
        ("ADD", None, "The user has a cat."),
    ]
    assert [d.fact_index for d in decisions] == [None, 1, 0, 2]
    [request] = openai_server.chat_requests
    prompt = request["body"]["messages"][0]["content"]
    assert '"id": "0"' in prompt and '"id": "1"' in prompt
    assert "mem-a" not in prompt and "mem-b" not in prompt
    assert json.dumps(new_facts, indent=2) in prompt


def test_llm_invented_ids_are_ignored(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(
        Reply.json(
            [
                {"id": "7", "text": "The user loves pizza.", "event": "DELETE"},
                {"id": "mem-a", "text": "The user loves pizza.", "event": "DELETE"},
                {"id": "-1", "text": "The user loves pizza.", "event": "DELETE"},
                {"id": "1", "text": "The user has a cat.", "event": "ADD"},
            ]
        )
    )
    decisions, error = reconcile_llm(make_llm(openai_server), ["The user has a cat."], [PIZZA])
    assert error is None
    assert events(decisions) == [
        ("NONE", "mem-a", "The user loves pizza."),
        ("ADD", None, "The user has a cat."),
    ]
    assert decisions[0].reason == "not in the LLM answer"


def test_llm_first_decision_per_id_wins_and_stored_texts_are_not_re_added(
    openai_server: ScriptedOpenAIServer,
) -> None:
    openai_server.push(
        Reply.json(
            [
                {"id": "0", "text": "The user loves pizza.", "event": "NONE"},
                {"id": "0", "text": "The user loves pizza.", "event": "DELETE"},
                {"id": "1", "text": "The user loves pizza.", "event": "ADD"},
            ]
        )
    )
    decisions, error = reconcile_llm(make_llm(openai_server), ["The user loves pizza."], [PIZZA])
    assert error is None
    assert events(decisions) == [("NONE", "mem-a", "The user loves pizza.")]


def test_llm_left_out_facts_are_added_and_left_out_memories_kept(
    openai_server: ScriptedOpenAIServer,
) -> None:
    openai_server.push(Reply.json([{"id": "0", "text": "The user loves pizza.", "event": "NONE"}]))
    decisions, error = reconcile_llm(
        make_llm(openai_server), ["The user has a cat."], [PIZZA, PARIS]
    )
    assert error is None
    assert events(decisions) == [
        ("NONE", "mem-a", "The user loves pizza."),
        ("NONE", "mem-b", "The user lives in Paris."),
        ("ADD", None, "The user has a cat."),
    ]
    assert decisions[2].reason == "left out by the LLM: added by default"


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (Reply.delay(1.0, Reply.json([])), "timeout"),
        (Reply.status(500), "http"),
        (Reply.text("I think you should delete memory 0."), "malformed"),
        (Reply.json([{"id": "0", "event": "EXPLODE", "text": "x"}]), "schema"),
    ],
)
def test_llm_failure_adds_all_new_facts_and_reports_the_error(
    openai_server: ScriptedOpenAIServer, reply: Reply, kind: str
) -> None:
    openai_server.push(reply)
    decisions, error = reconcile_llm(
        make_llm(openai_server, timeout=0.3),
        ["The user now hates pizza.", "The user has a cat.", "The user has a cat."],
        [PIZZA],
    )
    assert error is not None
    assert error.kind == kind
    assert events(decisions) == [
        ("NONE", "mem-a", "The user loves pizza."),
        ("ADD", None, "The user now hates pizza."),
        ("ADD", None, "The user has a cat."),
    ]


def test_llm_is_not_called_without_neighbours(openai_server: ScriptedOpenAIServer) -> None:
    decisions, error = reconcile_llm(make_llm(openai_server), ["The user loves pizza."], [])
    assert error is None
    assert events(decisions) == [("ADD", None, "The user loves pizza.")]
    assert openai_server.chat_requests == []
