"""Entity extraction (seed 004 `ner`) and entity resolution (seed 004 `entities`)."""

from __future__ import annotations

import itertools
import time

import pytest

from memory_dag.memories.entities import (
    EntityMention,
    KnownEntity,
    accurate_extractor_available,
    canonical_name,
    deduplicate_overlaps,
    extract_entities,
    resolve,
    spacy_entity,
)


def found(text: str) -> list[tuple[str, str, str]]:
    return [(m.type, m.text, m.canonical) for m in extract_entities(text)]


def test_email_is_found_and_lowercased() -> None:
    text = "Write to John.Doe@Example.COM today."
    [mention] = extract_entities(text)
    assert (mention.type, mention.canonical) == ("email", "john.doe@example.com")
    assert text[mention.start : mention.end] == "John.Doe@Example.COM"
    assert mention.provider == "regex"


def test_url_is_found_without_trailing_punctuation() -> None:
    assert found("Docs are at https://Example.com/Guide#Setup. Thanks") == [
        ("url", "https://Example.com/Guide#Setup", "https://example.com/guide#setup")
    ]


def test_mentions_and_hashtags_lose_their_sigil() -> None:
    assert found("Ping @Bob_99 about #MachineLearning") == [
        ("mention", "@Bob_99", "bob_99"),
        ("hashtag", "#MachineLearning", "machinelearning"),
    ]


def test_email_is_not_read_as_a_mention_and_numbers_are_not_hashtags() -> None:
    assert found("mail anne@site.org re issue #42") == [("email", "anne@site.org", "anne@site.org")]


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("We met on 8 May 2023 there", "2023-05-08"),
        ("We met on May 8, 2023 there", "2023-05-08"),
        ("We met on 2023-05-08 there", "2023-05-08"),
        ("at 1:56 pm on 8 May, 2023", "2023-05-08"),
        ("it was the 3rd of March 2021", "2021-03-03"),
        ("back in June 2023 it rained", "2023-06"),
    ],
)
def test_absolute_dates_are_canonicalised_to_iso(text: str, iso: str) -> None:
    dates = [m for m in extract_entities(text) if m.type == "date"]
    assert [m.canonical for m in dates] == [iso]


def test_relative_and_impossible_dates_are_not_entities() -> None:
    assert found("yesterday and last week I was busy; tomorrow too") == []
    # An impossible day is not a date; the month it names still is.
    impossible = [m.canonical for m in extract_entities("on 31 February 2023") if m.type == "date"]
    assert impossible == ["2023-02"]


def test_relation_cue_makes_a_person() -> None:
    [anne] = extract_entities("my wife is Anne")
    assert (anne.type, anne.canonical, anne.confidence) == ("person", "Anne", 0.9)
    assert found("The user's wife is named Anne.") == [("person", "Anne", "Anne")]
    assert found("Anne is my sister.") == [("person", "Anne", "Anne")]
    assert found("I had lunch with my best friend Jen Walsh") == [
        ("person", "Jen Walsh", "Jen Walsh")
    ]


def test_relation_cue_needs_a_capitalised_name() -> None:
    assert found("my wife is amazing and kind") == []


def test_place_organisation_and_project_cues() -> None:
    assert found("I live in Paris but I moved to New York City") == [
        ("location", "Paris", "Paris"),
        ("location", "New York City", "New York City"),
    ]
    assert found("These days I work at Acme Corp") == [("organization", "Acme Corp", "Acme Corp")]
    assert found("I'm working on Apollo") == [("project", "Apollo", "Apollo")]
    assert found("The Phoenix project ships soon") == [("project", "Phoenix", "Phoenix")]
    assert found("She studied at the University of Oxford") == [
        ("organization", "University of Oxford", "University of Oxford")
    ]


def test_titles_stay_with_the_name() -> None:
    assert found("I saw Dr. Smith today") == [("person", "Dr. Smith", "Dr. Smith")]


def test_capitalised_words_that_are_not_names() -> None:
    assert found("I think The weather on Monday in May was nice. My day was fine.") == []
    assert found("Painting looks like a great outlet.") == []
    assert found("Thanks! Good to see you.") == []


def test_sentence_initial_names_need_evidence() -> None:
    # A subject verb or a possessive after the word marks it as a name...
    assert found("Caroline loves pizza.") == [("other", "Caroline", "Caroline")]
    assert found("Melanie's kids are great.") == [("other", "Melanie", "Melanie")]
    # ...and so does the same word capitalised mid-sentence.
    assert found("Lisbon. I miss Lisbon.") == [
        ("other", "Lisbon", "Lisbon"),
        ("other", "Lisbon", "Lisbon"),
    ]
    # Mid-sentence capitalised words are kept, leading sentence starters are stripped.
    assert found("Hi Mel, I met Tom Baker") == [
        ("other", "Mel", "Mel"),
        ("other", "Tom Baker", "Tom Baker"),
    ]


def test_overlaps_keep_highest_confidence_then_longest() -> None:
    low = EntityMention("Anne", "Anne", "other", 0, 4, 0.5, "regex")
    high = EntityMention("Anne", "Anne", "person", 0, 4, 0.9, "regex")
    longer = EntityMention("Anne Smith", "Anne Smith", "other", 0, 10, 0.5, "regex")
    apart = EntityMention("Rome", "Rome", "location", 20, 24, 0.8, "regex")
    assert deduplicate_overlaps([low, apart, high]) == [high, apart]
    assert deduplicate_overlaps([low, longer]) == [longer]
    # In a real text the email (0.99) beats the capitalised name inside it.
    assert found("Mail Anne.Smith@Example.org now") == [
        ("email", "Anne.Smith@Example.org", "anne.smith@example.org")
    ]


def test_canonical_names() -> None:
    assert canonical_name("  new   york ", "location") == "New York"
    assert canonical_name("University of oxford", "organization") == "University of Oxford"
    assert canonical_name("McDonald's", "organization") == "McDonald"
    assert canonical_name("@Bob", "mention") == "bob"
    assert canonical_name("#Rust", "hashtag") == "rust"
    assert canonical_name("ME@X.IO", "email") == "me@x.io"
    assert canonical_name("May 8, 2023", "date") == "2023-05-08"


def test_unknown_strategy_is_rejected() -> None:
    with pytest.raises(ValueError, match="strategy"):
        extract_entities("Anne", strategy="best")  # type: ignore[arg-type]


def test_accurate_equals_fast_without_spacy() -> None:
    if accurate_extractor_available():
        pytest.skip("spaCy model installed: accurate adds spaCy entities")
    text = "my wife is Anne and we live in Paris since 8 May 2023, ping @anne"
    assert extract_entities(text, "accurate") == extract_entities(text, "fast")


def test_spacy_labels_map_to_our_types() -> None:
    person = spacy_entity("Anne Smith", 5, "PERSON")
    assert person is not None
    assert (person.type, person.provider, person.start, person.end) == ("person", "spacy", 5, 15)
    assert spacy_entity("Acme", 0, "ORG").type == "organization"  # type: ignore[union-attr]
    assert spacy_entity("Berlin", 0, "GPE").type == "location"  # type: ignore[union-attr]
    assert spacy_entity("8 May 2023", 0, "DATE").canonical == "2023-05-08"  # type: ignore[union-attr]
    assert spacy_entity("yesterday", 0, "DATE") is None
    assert spacy_entity("three", 0, "CARDINAL") is None


ANNE = KnownEntity("ent_1", "Anne", "person", ("Annie", "A. Smith"))
PARIS = KnownEntity("ent_2", "Paris", "location")


def mention(text: str, type: str) -> EntityMention:
    return EntityMention(text, canonical_name(text, type), type, 0, len(text), 0.9, "regex")


def test_resolver_finds_by_canonical_name_and_type() -> None:
    assert resolve(mention("Anne", "person"), [PARIS, ANNE]) is ANNE
    assert resolve(mention("Bob", "person"), [PARIS, ANNE]) is None


def test_resolver_prefers_name_and_type_over_an_alias() -> None:
    alias_holder = KnownEntity("ent_3", "Anne Marie", "person", ("Anne",))
    assert resolve(mention("Anne", "person"), [alias_holder, ANNE]) is ANNE


def test_resolver_falls_back_to_aliases_case_insensitively() -> None:
    assert resolve(mention("annie", "person"), [PARIS, ANNE]) is ANNE
    assert resolve(mention("a. smith", "person"), [PARIS, ANNE]) is ANNE


def test_resolver_respects_types_but_other_matches_any_name_type() -> None:
    assert resolve(mention("#paris", "hashtag"), [PARIS]) is None
    assert resolve(mention("Paris", "other"), [PARIS]) is PARIS
    assert resolve(mention("Paris", "person"), [PARIS]) is None


def test_resolver_picks_the_same_entity_whatever_order_the_matches_come_in() -> None:
    # Entity ids are random: an order of candidates that follows them must not pick the entity.
    bare = KnownEntity("ent_4", "Anne", "other")
    named = KnownEntity("ent_5", "Anne Marie", "person", ("Anne",))
    lee = KnownEntity("ent_6", "Anne Lee", "person", ("Anne",))
    for candidates in itertools.permutations([bare, named, lee]):
        # The mention's own type before `other`, then the first canonical name of that type.
        assert resolve(mention("Anne", "person"), candidates) is lee
        # An `other` mention matches every name type: a canonical name before an alias.
        assert resolve(mention("Anne", "other"), candidates) is bare
    for candidates in itertools.permutations([named, lee]):
        assert resolve(mention("Anne", "other"), candidates) is lee


def test_long_title_cased_text_stays_fast() -> None:
    # Unbounded name runs made the cue patterns quadratic: 18k characters took 5 s.
    started = time.perf_counter()
    mentions = extract_entities("Anne Bob " * 2000)
    assert time.perf_counter() - started < 1.0
    assert all(len(m.text.split()) <= 6 for m in mentions)
