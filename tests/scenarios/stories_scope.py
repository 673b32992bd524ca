"""Stories of scope: several users in one conversation, agents with different allowlists,
procedures, reflections, and reads that must be refused (issue 13 items 1-3)."""

from __future__ import annotations

from tests.scenarios.harness import (
    Check,
    Context,
    Forget,
    Nightly,
    Procedure,
    Remember,
    Say,
    Story,
    Summarize,
)

#: Max's conversation: one fact of each category an agent might or might not read.
WORK_TURNS = [
    ("Max", "max", "I need to finish the quarterly report."),  # tasks
    ("Max", "max", "I'm working on Project Harbor."),  # projects
    ("Max", "max", "I love jazz."),  # preferences
    ("Max", "max", "I'm allergic to peanuts."),  # profile
    ("Max", "max", "I plan to run a marathon."),  # goals
]

#: Assistant turns that make the conversation long enough to be summarised (over 100 tokens).
CHATTER = [
    ("Iris", None, "Noted: the quarterly report comes first, then Project Harbor work."),
    ("Iris", None, "I will keep the peanut allergy in mind when suggesting places to eat."),
    ("Iris", None, "Jazz for focus sessions sounds good; I can suggest a few albums later."),
    ("Iris", None, "For the marathon, a sixteen week plan with three runs a week works well."),
]

STORIES = [
    Story(
        "two_users_in_one_conversation",
        "each user's facts are theirs; the shared transcript stays shared",
        [
            Say(
                "team",
                "s1",
                [("Alice", "alice", "I love sushi."), ("Bob", "bob", "I hate sushi.")],
                day=0,
            ),  # fmt: skip
            Check(
                active=["Alice loves sushi.", "Bob hates sushi."],
                contexts=[
                    Context(
                        "sushi?",
                        "team",
                        user="alice",
                        shows=["[preferences] Alice loves sushi."],
                        hides=["[preferences] Bob hates sushi."],
                    ),
                    Context(
                        "sushi?",
                        "team",
                        user="bob",
                        shows=["[preferences] Bob hates sushi."],
                        hides=["[preferences] Alice loves sushi."],
                    ),
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "two_users_same_name_never_contradict",
        "one user's statement never deletes another user's fact, even with the same wording",
        [
            Say("team", "s1", [("Sam", "sam-a", "I love sushi.")], day=0),
            Say("team", "s1", [("Sam", "sam-b", "I hate sushi.")], day=0.1),
            Check(
                active=["Sam loves sushi.", "Sam hates sushi."],
                contexts=[
                    Context(
                        "sushi?",
                        "team",
                        user="sam-a",
                        shows=["[preferences] Sam loves sushi."],
                        hides=["[preferences] Sam hates sushi."],
                    )
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "same_text_two_users_two_memories",
        "remember deduplicates per user, never across users (item 2)",
        [
            Remember("The user likes pizza.", user="alice", conversation="team", day=0),
            Remember("The user likes pizza.", user="bob", conversation="team", day=0),
            Remember("The user likes pizza.", user="alice", conversation="team", day=0.1),
            Forget("The user likes pizza.", user="alice", day=1),
            Check(
                active=["The user likes pizza."],
                contexts=[
                    Context("pizza?", "team", user="bob", shows=["The user likes pizza."]),
                    Context("pizza?", "team", user="alice", hides=["likes pizza"]),
                ],
                day=1.5,
            ),
        ],
    ),
    Story(
        "delta_header_follows_the_user",
        "the delta header shows only the caller's changes and allowlist (item 1)",
        [
            Remember("Alice prefers window seats.", user="alice", conversation="travel", day=0),
            Remember("Bob prefers aisle seats.", user="bob", conversation="travel", day=0),
            Remember(
                "Alice must book the hotel by Friday.", user="alice", conversation="travel", day=0
            ),  # fmt: skip
            Check(
                contexts=[
                    Context(
                        "trip plans",
                        "travel",
                        user="alice",
                        agent="supervisor",
                        shows=["+created: [preferences] Alice prefers window seats"],
                        hides=["Bob", "aisle"],
                    ),
                    Context(
                        "trip plans",
                        "travel",
                        user="alice",
                        agent="planner",
                        shows=["Alice must book the hotel by Friday"],
                        hides=["window seats", "Bob", "aisle"],
                    ),
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "a_multi_user_store_refuses_anonymous_reads",
        "fail closed: a store of several users is not read without a user",
        [
            Remember("Alice prefers window seats.", user="alice", conversation="travel", day=0),
            Remember("Bob prefers aisle seats.", user="bob", conversation="travel", day=0),
            Check(
                contexts=[
                    Context("seats?", "travel", refused=True),
                    Context("seats?", "travel", user="carol", hides=["seats"]),
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "three_agents_three_allowlists",
        "planner, stylist and supervisor each see their categories and nothing else",
        [
            Say("work", "s1", WORK_TURNS, day=0),
            Check(
                active=[
                    "Max needs to finish the quarterly report.",
                    "Max is working on Project Harbor.",
                    "Max loves jazz.",
                    "Max is allergic to peanuts.",
                    "Max plans to run a marathon.",
                ],
                contexts=[
                    Context(
                        "what matters this week?",
                        "work",
                        user="max",
                        agent="planner",
                        shows=[
                            "[tasks] Max needs to finish the quarterly report.",
                            "[projects] Max is working on Project Harbor.",
                            "[goals] Max plans to run a marathon.",
                        ],
                        hides=["jazz", "peanuts", "[user]"],
                    ),
                    Context(
                        "what music?",
                        "work",
                        user="max",
                        agent="stylist",
                        shows=["[preferences] Max loves jazz."],
                        hides=["quarterly report", "peanuts", "Harbor", "[user]"],
                    ),
                    Context(
                        "anything to know?",
                        "work",
                        user="max",
                        agent="supervisor",
                        shows=[
                            "[profile] Max is allergic to peanuts.",
                            "[preferences] Max loves jazz.",
                        ],
                        hides=["[projects]"],
                    ),
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "agents_write_only_what_they_may_read",
        "writes outside the allowlist and unknown categories are refused (item 3)",
        [
            Remember(
                "Max loves jazz.",
                user="max",
                conversation="work",
                agent="planner",
                refused=True,
                day=0,
            ),  # fmt: skip
            Remember(
                "Max knows the vault code.",
                user="max",
                conversation="work",
                category="topsecret",
                refused=True,
                day=0,
            ),  # fmt: skip
            Remember(
                "Max must file the expenses.",
                user="max",
                conversation="work",
                agent="planner",
                day=0,
            ),  # fmt: skip
            Check(
                active=["Max must file the expenses."],
                gone=["Max loves jazz.", "Max knows the vault code."],
                contexts=[
                    Context(
                        "todo?",
                        "work",
                        user="max",
                        agent="planner",
                        shows=["[tasks] Max must file the expenses."],
                    )
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "a_summary_only_for_agents_that_may_read_all_of_it",
        "the conversation summary is shown only when every category under it is readable "
        "(a user's own facts stay out of the conversation's summary)",
        [
            Say("work", "s1", [*WORK_TURNS, *CHATTER], day=0),
            Summarize("work", day=0.5),
            Check(
                contexts=[
                    Context("recap", "work", user="max", shows=["## Conversation summary"]),
                    Context(
                        "recap",
                        "work",
                        user="max",
                        agent="stylist",
                        hides=["## Conversation summary", "peanuts", "quarterly"],
                    ),
                    Context(
                        "recap",
                        "work",
                        user="max",
                        agent="planner",
                        hides=["## Conversation summary"],
                    ),  # turns read as `event`
                    Context(
                        "recap",
                        "work",
                        user="max",
                        agent="supervisor",
                        shows=["## Conversation summary"],
                    ),
                ],
                day=0.6,
            ),  # fmt: skip
        ],
    ),
    Story(
        "procedures_only_when_asked_for",
        "a procedure's steps stay out of context unless its category is asked for by name",
        [
            Remember("Max must deploy the blog on Friday.", user="max", conversation="ops", day=0),
            Procedure(
                "Deploy the blog",
                ["Run the tests", "Build the site", "Upload with rsync"],
                user="max",
                conversation="ops",
                day=0,
            ),  # fmt: skip
            Check(
                contexts=[
                    Context(
                        "deploy the blog",
                        "ops",
                        user="max",
                        shows=["Max must deploy the blog on Friday."],
                        hides=["Upload with rsync"],
                    ),
                    Context(
                        "deploy the blog",
                        "ops",
                        user="max",
                        agent="planner",
                        hides=["Upload with rsync"],
                    ),
                    Context(
                        "deploy the blog",
                        "ops",
                        user="max",
                        agent="executor",
                        categories=["procedural"],
                        shows=["Upload with rsync"],
                    ),
                    Context(
                        "deploy the blog",
                        "ops",
                        user="max",
                        agent="stylist",
                        hides=["Upload with rsync"],
                    ),
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "a_forgotten_procedure_is_gone",
        "forgetting a procedure removes it even for the agents that ask for procedures",
        [
            Procedure(
                "Rotate the keys",
                ["Create a new key", "Deploy it", "Revoke the old one"],
                user="max",
                conversation="ops",
                day=0,
            ),  # fmt: skip
            Forget(
                "Rotate the keys:\n1. Create a new key\n2. Deploy it\n3. Revoke the old one",
                user="max",
                day=1,
            ),  # fmt: skip
            Check(
                contexts=[
                    Context(
                        "rotate keys",
                        "ops",
                        user="max",
                        agent="executor",
                        categories=["procedural"],
                        hides=["Revoke the old one"],
                    )
                ],
                day=1.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "reflections_belong_to_their_user",
        "the weekly reflection of a user is shown to that user only",
        [
            Say(
                "run",
                "s1",
                [
                    ("Ana", "ana", "I started training for a marathon."),
                    ("Ana", "ana", "I run 10 km every Tuesday."),
                    ("Ana", "ana", "I bought new running shoes."),
                ],
                day=0,
            ),
            Say(
                "chess",
                "s1",
                [
                    ("Ben", "ben", "I started learning chess."),
                    ("Ben", "ben", "I play chess every Sunday."),
                    ("Ben", "ben", "I bought a chess clock."),
                ],
                day=0,
            ),  # fmt: skip
            Nightly(day=2),
            Check(
                contexts=[
                    Context(
                        "how is training going?",
                        "run",
                        user="ana",
                        shows=["## Weekly reflection", "marathon"],
                        hides=["chess"],
                    ),
                    Context(
                        "how is chess going?",
                        "chess",
                        user="ben",
                        shows=["## Weekly reflection"],
                        hides=["running shoes"],
                    ),
                ],
                day=2.5,
            ),  # fmt: skip
        ],
    ),
    Story(
        "a_user_never_sees_another_conversations_turns",
        "shared turns are read only in the conversation asked for",
        [
            Say(
                "alice-chat",
                "s1",
                [("Alice", "alice", "I keep my passport in the blue drawer.")],
                day=0,
            ),  # fmt: skip
            Say("bob-chat", "s1", [("Bob", "bob", "I like hiking.")], day=0),
            Check(
                contexts=[
                    Context("where is the passport?", "bob-chat", user="bob", hides=["passport"]),
                    Context(
                        "where is the passport?", "alice-chat", user="alice", shows=["passport"]
                    ),
                ],
                day=0.5,
            ),  # fmt: skip
        ],
    ),
]
