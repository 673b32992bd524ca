"""Stories of time and consent: decay, expiry, purge, nightly merges, sessions that close, and
changes to sensitive fields that wait for the user's consent."""

from __future__ import annotations

from tests.scenarios.harness import (
    Check,
    Confirm,
    Context,
    Decide,
    Forget,
    Nightly,
    Remember,
    Restore,
    Say,
    Story,
)

STORIES = [
    Story(
        "ttl_expiry_then_restore",
        "an unused fact expires after 60 days; restored, later nights keep it (item 8)",
        [
            Remember("Kim plays the guitar on weekends.", conversation="music", day=0),
            Nightly(day=61),
            Check(
                gone=["Kim plays the guitar on weekends."],
                contexts=[Context("guitar?", "music", hides=["guitar"])],
                day=61.2,
            ),  # fmt: skip
            Restore("Kim plays the guitar on weekends.", day=61.5),
            Nightly(day=62),
            Nightly(day=63),
            Check(
                active=["Kim plays the guitar on weekends."],
                contexts=[Context("guitar?", "music", shows=["Kim plays the guitar on weekends."])],
                day=63.2,
            ),  # fmt: skip
        ],
    ),
    Story(
        "confirmed_facts_outlive_disuse",
        "decay and TTL take what nobody uses; a confirmed fact stays",
        [
            Remember("Eve is allergic to peanuts.", conversation="health", day=0),
            Remember("Eve watched a film on Sunday.", conversation="health", day=0),
            Confirm("Eve is allergic to peanuts.", day=0.5),
            Nightly(day=61),
            Check(
                active=["Eve is allergic to peanuts."],
                gone=["Eve watched a film on Sunday."],
                contexts=[
                    Context(
                        "what should I know about Eve?",
                        "health",
                        shows=["Eve is allergic to peanuts."],
                        hides=["film"],
                    )
                ],
                day=61.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "decay_takes_what_is_not_confirmed",
        "confidence decays nightly; a confirmed fact never decays",
        [
            Remember("Kim owns a blue kayak.", conversation="gear", day=0),
            Remember("Kim owns a red tent.", conversation="gear", day=0),
            Confirm("Kim owns a red tent.", day=0.5),
            Nightly(day=35),
            Check(
                active=["Kim owns a red tent."],
                gone=["Kim owns a blue kayak."],
                contexts=[
                    Context("what gear?", "gear", shows=["Kim owns a red tent."], hides=["kayak"])
                ],
                day=35.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "forgotten_is_purged_after_thirty_days",
        "a forgotten memory is purged 30 days later and never comes back",
        [
            Remember("Kim's locker code is written on a card.", conversation="gym", day=0),
            Forget("Kim's locker code is written on a card.", day=1),
            Nightly(day=32),
            Check(
                gone=["Kim's locker code is written on a card."],
                contexts=[Context("locker?", "gym", hides=["locker"])],
                day=32.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "nightly_merge_keeps_one_copy",
        "two sayings of one fact merge overnight: one memory, nothing lost",
        [
            Say("pets", "s1", [("Eve", None, "I adopted a cat named Miso.")], day=0),
            Say("pets", "s2", [("Eve", None, "I have a cat called Miso.")], day=1),
            Nightly(day=1.8),
            Check(
                active=["Eve has a cat called Miso."],
                gone=["Eve adopted a cat named Miso."],
                contexts=[
                    Context(
                        "pets?",
                        "pets",
                        shows=["Eve has a cat called Miso."],
                        hides=["[activity] Eve adopted a cat named Miso."],
                    )
                ],
                day=2,
            ),  # fmt: skip
        ],
    ),
    Story(
        "a_closing_session_writes_nothing_twice",
        "facts of the live session, then its close: each fact once",
        [
            Say("music", "s1", [("Kim", None, "I love jazz.")], day=0),
            Check(once=["Kim loves jazz."], day=0.1),
            Say("music", "s2", [("Kim", None, "Hi again.")], day=1),
            Nightly(day=1.5),
            Check(
                once=["Kim loves jazz."],
                contexts=[Context("music?", "music", shows=["Kim loves jazz."])],
                day=1.6,
            ),
        ],
    ),
    Story(
        "city_change_waits_for_consent",
        "a sensitive field (city) changes only on consent (item 10)",
        [
            Say("home", "s1", [("Cy", "cy", "I live in Lisbon.")], day=0),
            Say("home", "s1", [("Cy", "cy", "I moved to Porto.")], day=1),
            Check(
                active=["Cy lives in Lisbon."],
                gone=["Cy moved to Porto."],
                pending=["Cy moved to Porto."],
                contexts=[
                    Context(
                        "where does Cy live?",
                        "home",
                        user="cy",
                        shows=["[profile] Cy lives in Lisbon."],
                        hides=["[profile] Cy moved to Porto."],
                    )
                ],
                day=1.5,
            ),  # fmt: skip
            Decide("Cy moved to Porto.", accept=True, user="cy", day=2),
            Check(
                active=["Cy moved to Porto."],
                gone=["Cy lives in Lisbon."],
                stale=["Cy lives in Lisbon", "I live in Lisbon"],
                contexts=[
                    Context(
                        "where does Cy live?",
                        "home",
                        user="cy",
                        shows=["[profile] Cy moved to Porto."],
                    )
                ],
                day=2.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "name_change_rejected_then_expired",
        "a rejected change leaves the fact; an undecided one expires after 7 days",
        [
            Say("chat", "s1", [("Sam", "sam", "My name is Samuel.")], day=0),
            Say("chat", "s1", [("Sam", "sam", "My name is Sammy.")], day=1),
            Decide("Sam's name is Sammy.", accept=False, user="sam", day=1.5),
            Say("chat", "s1", [("Sam", "sam", "My name is Samson.")], day=2),
            Check(pending=["Sam's name is Samson."], day=2.5),
            Nightly(day=10),
            Check(
                active=["Sam's name is Samuel."],
                gone=["Sam's name is Sammy.", "Sam's name is Samson."],
                contexts=[
                    Context(
                        "what is his name?",
                        "chat",
                        user="sam",
                        shows=["Sam's name is Samuel."],
                        hides=["[profile] Sam's name is Sammy", "[profile] Sam's name is Samson"],
                    )
                ],
                day=10.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "benign_tone_applies_when_corroborated",
        "a benign field (tone) changes once two turns say it",
        [
            Say("chat", "s1", [("Cy", "cy", "I prefer short answers.")], day=0),
            Say("chat", "s1", [("Cy", "cy", "I prefer detailed answers.")], day=1),
            Check(
                active=["Cy prefers short answers."],
                pending=["Cy prefers detailed answers."],
                day=1.5,
            ),  # fmt: skip
            Say("chat", "s1", [("Cy", "cy", "Really, I prefer detailed answers.")], day=2),
            Check(
                active=["Cy prefers detailed answers."],
                gone=["Cy prefers short answers."],
                stale=["Cy prefers short answers"],
                contexts=[
                    Context(
                        "how should I answer?",
                        "chat",
                        user="cy",
                        shows=["Cy prefers detailed answers."],
                    )
                ],
                day=2.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "a_fields_first_value_needs_no_consent",
        "the first city is written at once; an ordinary fact changes without the queue",
        [
            Say(
                "home",
                "s1",
                [("Ria", "ria", "I live in Braga."), ("Ria", "ria", "I love tea.")],
                day=0,
            ),  # fmt: skip
            Say("home", "s1", [("Ria", "ria", "I hate tea now.")], day=1),
            Check(
                active=["Ria lives in Braga.", "Ria now hates tea."],
                gone=["Ria loves tea."],
                stale=["Ria loves tea"],
                contexts=[
                    Context(
                        "about Ria",
                        "home",
                        user="ria",
                        shows=["Ria lives in Braga.", "Ria now hates tea."],
                    )
                ],
                day=1.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "remembered_then_forgotten_then_remembered_again",
        "a fact remembered again after forgetting is a new memory, the old stays gone",
        [
            Remember("Kim swims on Mondays.", conversation="sport", day=0),
            Forget("Kim swims on Mondays.", day=1),
            Remember("Kim swims on Mondays.", conversation="sport", day=2),
            Check(
                once=["Kim swims on Mondays."],
                contexts=[Context("sport?", "sport", shows=["Kim swims on Mondays."])],
                day=2.5,
            ),  # fmt: skip
        ],
    ),
]
