"""A small multi-user workspace for the shard tests: one conversation per user, plus shared notes,
a conversation of two users and a transcript outside any conversation folder."""

from __future__ import annotations

from pathlib import Path

from memory_dag.config import Settings
from memory_dag.store.shards import shard_of, user_key
from tests.conftest import write_jsonl

TOPICS = [
    ("Lisbon", "I moved to Lisbon last spring and I love the trams."),
    ("pizza", "My favourite food is pizza with anchovies."),
    ("chess", "I play chess every Tuesday at the club."),
    ("Kyoto", "I am planning a trip to Kyoto in April."),
    ("violin", "I have been learning the violin for two years."),
    ("running", "I run ten kilometres every Sunday morning."),
]


def user_turns(user: str, topic: int, sessions: int, turns: int, day: int = 1) -> list[list[dict]]:
    """`sessions` sessions of `turns` alternating user/assistant lines naming `user`."""
    name, line = TOPICS[topic % len(TOPICS)]
    result = []
    for session in range(sessions):
        records = []
        for turn in range(turns):
            role = "user" if turn % 2 == 0 else "assistant"
            text = (
                f"{line} Session {session} turn {turn} about {name} for {user}."
                if role == "user"
                else f"That sounds great, tell me more about {name} ({session}.{turn})."
            )
            records.append(
                {
                    "id": f"{user}-s{session}-t{turn}",
                    "role": role,
                    "name": user.title() if role == "user" else "Iris",
                    "content": text,
                    "user_id": user,
                    "created_at": f"2026-10-{day + session:02d}T10:{turn % 60:02d}:00Z",
                }
            )
        result.append(records)
    return result


def users_covering(shards: int, per_shard: int) -> list[str]:
    """User ids, in order, until every shard holds at least `per_shard` of them."""
    names: list[str] = []
    counts = [0] * shards
    number = 0
    while min(counts) < per_shard:
        name = f"user{number:03d}"
        counts[shard_of(user_key(name), shards)] += 1
        names.append(name)
        number += 1
    return names


def write_corpus(
    root: Path,
    users: int = 12,
    sessions: int = 2,
    turns: int = 6,
    names: list[str] | None = None,
) -> list[str]:
    """Write the workspace under `root`; returns the user ids."""
    names = names or [f"user{number:03d}" for number in range(users)]
    for number, user in enumerate(names):
        for session, records in enumerate(user_turns(user, number, sessions, turns)):
            write_jsonl(
                root / "sessions" / f"conv-{user}" / f"2026-10-{session + 1:02d}.jsonl", records
            )
    (root / "MEMORY.md").write_text("# Shared notes\n\nThe team meets on Mondays.\n")
    entry = root / "entries" / f"conv-{names[0]}" / "facts" / "f1.md"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(f"---\nid: fact-1\nrole: memory\n---\n{names[0]} likes green tea.\n")
    # Two users in one conversation: routed by the conversation, not by either user.
    both = user_turns(names[1], 1, 1, 2)[0] + user_turns(names[2], 2, 1, 2, day=3)[0]
    write_jsonl(root / "sessions" / "conv-shared" / "2026-10-05.jsonl", both)
    # A transcript outside any conversation folder, of one user: routed by that user.
    write_jsonl(root / "sessions" / "loose.jsonl", user_turns(names[3], 3, 1, 2, day=7)[0])
    return names


def built_shards(root: Path, shards: int, users: int) -> Settings:
    """A corpus of `users` routed into `shards` shards under `root`, each shard built by the
    whole pipeline; returns the whole store's settings (MEMORY_DAG_SHARDS must say `shards`)."""
    from memory_dag.ingest.routing import route_workspace
    from memory_dag.pipeline import run_all
    from memory_dag.store.shards import all_shard_settings

    write_corpus(root / "ws", users=users)
    settings = Settings(workspace=root / "ws", db_path=root / "data" / "memory.duckdb")
    route_workspace(settings, shards)
    for shard in all_shard_settings(settings, shards):
        run_all(shard, include_open=True)
    return settings
