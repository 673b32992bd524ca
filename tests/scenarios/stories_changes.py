"""Stories of things that change: preferences that flip or refine, corrections, deletions and
restores. Each ends with what an agent must be told, and what it must no longer be told."""

from __future__ import annotations

from tests.scenarios.harness import (
    Check,
    Context,
    Correct,
    Forget,
    Remember,
    Restore,
    Say,
    Story,
    Summarize,
)


def flip(name: str, before: str, after: str, old_fact: str, new_fact: str, covers: str) -> Story:
    """A user says one thing in a session and the opposite a week later (another session)."""
    return Story(
        name,
        covers,
        [
            Say("home", "s1", [(name.split("_")[0].capitalize(), None, before)], day=0),
            Check(active=[old_fact], day=0.5),
            Say("home", "s2", [(name.split("_")[0].capitalize(), None, after)], day=7),
            Check(
                active=[new_fact],
                gone=[old_fact],
                stale=[old_fact],
                contexts=[Context("what do you know about me?", "home", shows=[new_fact])],
                day=7.5,
            ),
        ],
    )


STORIES = [
    Story(
        "pizza_across_sessions",
        "preference change across sessions; the old turn and fact never current; summary",
        [
            Say(
                "demo",
                "s1",
                [
                    ("Sam", None, "I love pizza, it's honestly my favourite food."),
                    ("Iris", None, "Noted, pizza it is."),
                ],
                day=0,
            ),  # fmt: skip
            Check(active=["Sam loves pizza."], day=0.1),
            Say("demo", "s2", [("Sam", None, "I got food poisoning. I hate pizza now.")], day=7),
            Summarize("demo", day=7.1),
            Check(
                active=["Sam now hates pizza."],
                gone=["Sam loves pizza."],
                stale=["Sam loves pizza", "I love pizza"],
                contexts=[
                    Context(
                        "what does Sam think of pizza?",
                        "demo",
                        shows=["[preferences] Sam now hates pizza."],
                        hides=["+created: [preferences] Sam loves pizza"],
                    ),
                ],  # fmt: skip
                day=7.2,
            ),
        ],
    ),
    Story(
        "pizza_within_the_live_session",
        "a preference flips inside the open session: facts as the turns arrive",
        [
            Say("demo", "s1", [("Sam", None, "I love pizza.")], day=0),
            Check(active=["Sam loves pizza."], day=0.01),
            Say("demo", "s1", [("Sam", None, "Actually I hate pizza now.")], day=0.02),
            Check(
                active=["Sam now hates pizza."],
                gone=["Sam loves pizza."],
                stale=["Sam loves pizza", "I love pizza"],
                contexts=[Context("pizza tonight?", "demo", shows=["Sam now hates pizza."])],
                day=0.03,
            ),
        ],
    ),
    flip(
        "dana_colour",
        "My favourite colour is blue.",
        "My favourite colour is green now.",
        "Dana's favorite colour is blue.",
        "Dana's favorite colour is green.",
        "a single-valued preference updated",
    ),  # fmt: skip
    flip(
        "lee_employer",
        "I work at Acme.",
        "I work at Globex now.",
        "Lee works at Acme.",
        "Lee works at Globex.",
        "a new employer replaces the old one",
    ),  # fmt: skip
    flip(
        "ana_coffee",
        "I love coffee.",
        "I don't like coffee anymore.",
        "Ana loves coffee.",
        "Ana no longer likes coffee.",
        "a contradiction deletes the old preference",
    ),  # fmt: skip
    flip(
        "bo_pizza",
        "I love pizza.",
        "I love pepperoni pizza.",
        "Bo loves pizza.",
        "Bo loves pepperoni pizza.",
        "a refinement updates the fact",
    ),  # fmt: skip
    flip(
        "zoe_diet",
        "I'm vegetarian.",
        "I'm no longer vegetarian.",
        "Zoe is vegetarian.",
        "Zoe is no longer vegetarian.",
        "a state that ends",
    ),  # fmt: skip
    flip(
        "gil_job",
        "I'm a teacher.",
        "I'm a high school teacher.",
        "Gil is a teacher.",
        "Gil is a high school teacher.",
        "an occupation made precise",
    ),  # fmt: skip
    flip(
        "ola_kids",
        "I have two kids.",
        "I have three kids.",
        "Ola has two kids.",
        "Ola has three kids.",
        "a count that changes",
    ),  # fmt: skip
    Story(
        "preferences_that_coexist",
        "several likes are several facts: none lost",
        [
            Say(
                "home",
                "s1",
                [
                    ("Ana", None, "I love coffee."),
                    ("Ana", None, "I love pasta."),
                    ("Ana", None, "I love jazz."),
                ],
                day=0,
            ),  # fmt: skip
            Check(
                active=["Ana loves coffee.", "Ana loves pasta.", "Ana loves jazz."],
                contexts=[
                    Context(
                        "what does Ana love?",
                        "home",
                        shows=["Ana loves coffee.", "Ana loves pasta.", "Ana loves jazz."],
                    )
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "correct_an_allergy",
        "a correction shows its net state in the delta header (issue 13 item 5)",
        [
            Remember("Sam is allergic to peanuts.", conversation="demo", day=0),
            Correct("Sam is allergic to peanuts.", "Sam is allergic to hazelnuts.", day=1),
            Check(
                active=["Sam is allergic to hazelnuts."],
                gone=["Sam is allergic to peanuts."],
                stale=["Sam is allergic to peanuts"],
                contexts=[
                    Context(
                        "any allergies?",
                        "demo",
                        shows=[
                            "+created: [profile] Sam is allergic to hazelnuts",
                            "[profile] Sam is allergic to hazelnuts.",
                        ],
                        hides=["peanuts"],
                    )
                ],
                day=1.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "correct_twice",
        "two corrections in a row: only the last one is current",
        [
            Remember("Sam's favourite tea is green tea.", conversation="demo", day=0),
            Correct("Sam's favourite tea is green tea.", "Sam's favourite tea is oolong.", day=1),
            Correct("Sam's favourite tea is oolong.", "Sam's favourite tea is jasmine.", day=2),
            Check(
                active=["Sam's favourite tea is jasmine."],
                gone=["Sam's favourite tea is oolong.", "Sam's favourite tea is green tea."],
                stale=["green tea", "oolong"],
                contexts=[Context("which tea?", "demo", shows=["jasmine"])],
                day=2.5,
            ),
        ],
    ),
    Story(
        "restore_needs_the_replacement_gone",
        "a replaced fact cannot come back beside its replacement; after forgetting it, it can",
        [
            Remember("Sam's desk is on floor two.", conversation="office", day=0),
            Correct("Sam's desk is on floor two.", "Sam's desk is on floor five.", day=1),
            Restore("Sam's desk is on floor two.", day=1.5, refused=True),
            Forget("Sam's desk is on floor five.", day=2),
            Restore("Sam's desk is on floor two.", day=2.5),
            Check(
                active=["Sam's desk is on floor two."],
                gone=["Sam's desk is on floor five."],
                contexts=[
                    Context(
                        "where is the desk?",
                        "office",
                        shows=["Sam's desk is on floor two."],
                        hides=["[profile] Sam's desk is on floor five."],
                    )
                ],
                day=3,
            ),  # fmt: skip
        ],
    ),
    Story(
        "correcting_a_fact_retires_its_turn",
        "a turn whose fact was corrected is not shown as current",
        [
            Say("demo", "s1", [("Sam", None, "I play the violin.")], day=0),
            Correct("Sam plays the violin.", "Sam plays the viola.", day=1),
            Check(
                active=["Sam plays the viola."],
                stale=["I play the violin", "Sam plays the violin"],
                contexts=[Context("which instrument?", "demo", shows=["Sam plays the viola."])],
                day=1.5,
            ),
        ],
    ),
    Story(
        "forget_hides_the_fact_and_its_turn",
        "a forgotten fact is gone, and so is the turn it came from",
        [
            Say("demo", "s1", [("Sam", None, "I love sushi.")], day=0),
            Forget("Sam loves sushi.", day=1),
            Check(
                gone=["Sam loves sushi."],
                stale=["sushi"],
                contexts=[Context("what food does Sam like?", "demo", hides=["sushi"])],
                day=1.5,
            ),
        ],
    ),
    Story(
        "forget_then_restore",
        "a restored fact is current again",
        [
            Remember("Sam collects vinyl records.", conversation="demo", day=0),
            Forget("Sam collects vinyl records.", day=1),
            Check(
                gone=["Sam collects vinyl records."],
                contexts=[Context("hobbies?", "demo", hides=["vinyl"])],
                day=1.5,
            ),  # fmt: skip
            Restore("Sam collects vinyl records.", day=2),
            Check(
                active=["Sam collects vinyl records."],
                contexts=[Context("hobbies?", "demo", shows=["Sam collects vinyl records."])],
                day=2.5,
            ),
        ],
    ),
    Story(
        "forget_stays_in_its_conversation",
        "forgetting in one conversation leaves the same text of another alone",
        [
            Remember("The user rides a red bike.", conversation="a", day=0),
            Remember("The user rides a red bike.", conversation="b", day=0),
            Forget("The user rides a red bike.", conversation="a", day=1),
            Check(
                active=["The user rides a red bike."],
                contexts=[
                    Context("bike?", "b", shows=["The user rides a red bike."]),
                    Context("bike?", "a", hides=["red bike"]),
                ],
                day=1.5,
            ),  # fmt: skip
        ],
    ),
]
