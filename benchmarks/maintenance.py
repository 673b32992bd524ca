"""The whole nightly maintenance set on a generated store, timed job by job.

    python benchmarks/maintenance.py [--memories 100000] [--conversations 200] [--seed 0]
        [--keep DIR]

Generates a store of N memories written with Arrow inserts (65% facts, 33% transcript turns,
2% summaries) over C conversations of about N / C memories each (between 0.75x and 1.25x, so
some conversations are above the 500-entry cap). Memories were created over the last 90 days, half
of them were retrieved in the last 10 days (access counts Zipf-distributed), importance 1-5,
decay rates 0.1 (70%), 0.02 (20%) and 0 (confirmed, 10%); 3% of the facts are reworded
near-duplicates of another fact of the same conversation (and a few repeat one by chance).
Every fact and summary is embedded and indexed before the clock starts (WordLlama, no LLM:
rule judgements, extractive reflection, insights skipped).

Then `nightly.run_nightly` runs three times and each job is timed: the first night over
the fresh store (its backlog: every fact never decayed, conversations over the cap), the same
night again (idempotent: nothing left to do), and the next night (steady state).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.index.build import build_search_index
from memory_dag.maintenance import nightly
from memory_dag.store.connection import insert_arrow, open_store

NAMES = ["Ana", "Ben", "Caro", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
SURNAMES = ["Silva", "Okafor", "Tanaka", "Berg", "Novak", "Haddad", "Reyes", "Kim", "Moreau"]
CITIES = ["Lisbon", "Toronto", "Osaka", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Porto", "Riga"]
FOODS = ["sushi", "pasta", "tacos", "ramen", "curry", "paella", "pho", "falafel", "pierogi"]
PETS = ["cat", "dog", "parrot", "rabbit", "turtle", "hamster"]
JOBS = ["nurse", "teacher", "pilot", "chef", "lawyer", "painter", "engineer", "baker"]
HOBBIES = ["chess", "surfing", "pottery", "climbing", "gardening", "cycling", "knitting"]
MONTHS = ["January", "March", "May", "July", "September", "November"]
#: (fact, its rewording): the rewordings are the planted near-duplicates.
TEMPLATES = [
    ("{name} loves {food}.", "{name} really loves eating {food}."),
    ("{name} adopted a {pet} named {other}.", "{name} has a {pet} called {other}."),
    ("{name} works as a {job} in {city}.", "{name} is a {job} working in {city}."),
    ("{name} visited {city} in {month}.", "{name} went to {city} in {month}."),
    ("{name} took up {hobby} this year.", "{name} started {hobby} this year."),
    ("{name} has {n} {pet}s.", "{name} has {m} {pet}s."),
]
TURNS = [
    "I finally tried the {food} place near the station.",
    "We are flying to {city} in {month}, I can't wait!",
    "My {pet} knocked over the plant again.",
    "Work was long today, the {job}s were all out sick.",
    "I spent the whole weekend on {hobby}.",
]
TS = pa.timestamp("us", tz="UTC")


def random_slots(rng: random.Random) -> dict[str, str]:
    return {
        "name": f"{rng.choice(NAMES)} {rng.choice(SURNAMES)}",
        "other": rng.choice(NAMES),
        "city": rng.choice(CITIES),
        "food": rng.choice(FOODS),
        "pet": rng.choice(PETS),
        "job": rng.choice(JOBS),
        "hobby": rng.choice(HOBBIES),
        "month": rng.choice(MONTHS),
        "n": str(rng.randint(2, 4)),
        "m": str(rng.randint(5, 7)),
    }


def generate(total: int, conversations: int, now: datetime, seed: int) -> pa.Table:
    """`total` memory rows, as an Arrow table in the `memories` column layout."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    sizes = np_rng.integers(
        int(0.75 * total / conversations), int(1.25 * total / conversations) + 1, conversations
    )
    sizes = np.maximum(1, np.round(sizes * total / sizes.sum()).astype(int))
    sizes[-1] += total - int(sizes.sum())
    rows: dict[str, list] = {key: [] for key in COLUMNS}
    serial = 0
    for conversation, size in enumerate(sizes):
        conversation_id = f"conv-{conversation:04d}"
        facts: list[tuple[int, dict[str, str]]] = []
        for _ in range(int(size)):
            serial += 1
            draw = rng.random()
            age_days = rng.uniform(0, 90)
            created = now - timedelta(days=age_days)
            if draw < 0.65:
                if facts and rng.random() < 0.03:
                    template_index, slots = rng.choice(facts)
                    content = TEMPLATES[template_index][1].format(**slots)
                else:
                    template_index, slots = rng.randrange(len(TEMPLATES)), random_slots(rng)
                    facts.append((template_index, slots))
                    content = TEMPLATES[template_index][0].format(**slots)
                kind = "fact"
                rate = rng.choices([0.1, 0.02, 0.0], weights=[70, 20, 10])[0]
            elif draw < 0.98:
                kind, rate = "episode", 0.0
                content = rng.choice(TURNS).format(**random_slots(rng))
            else:
                kind, rate = "summary", 0.0
                first, second = rng.sample(NAMES, 2)
                content = f"{first} and {second} talked about {rng.choice(HOBBIES)}."
            accessed = (
                now - timedelta(days=rng.uniform(0, min(10, age_days)))
                if kind == "fact" and rng.random() < 0.5
                else None
            )
            rows["id"].append(f"{kind[:3]}_{serial:08d}")
            rows["kind"].append(kind)
            rows["content"].append(content)
            rows["conversation_id"].append(conversation_id)
            rows["session_id"].append(f"s{int(age_days) // 7}")
            rows["source_role"].append("user")
            rows["speaker"].append(rng.choice(NAMES))
            rows["event_time"].append(created)
            rows["created_at"].append(created)
            rows["importance"].append(rng.choices([1, 2, 3, 4, 5], weights=[15, 55, 20, 7, 3])[0])
            rows["access_count"].append(int(np_rng.zipf(2.0)) - 1 if accessed else 0)
            rows["last_accessed"].append(accessed)
            rows["decay_rate"].append(rate)
            rows["source_ids"].append([f"ep_src_{serial}"] if kind == "fact" else [])
    return pa.table({key: pa.array(values, type=COLUMNS[key]) for key, values in rows.items()})


COLUMNS = {
    "id": pa.string(),
    "kind": pa.string(),
    "content": pa.string(),
    "conversation_id": pa.string(),
    "session_id": pa.string(),
    "source_role": pa.string(),
    "speaker": pa.string(),
    "event_time": TS,
    "created_at": TS,
    "importance": pa.int32(),
    "access_count": pa.int64(),
    "last_accessed": TS,
    "decay_rate": pa.float64(),
    "source_ids": pa.list_(pa.string()),
}


def night(settings: Settings, now: datetime, label: str) -> float:
    print(f"\n{label} ({now:%Y-%m-%d %H:%M} UTC)")
    total = 0.0
    for name, job in nightly.JOBS.items():
        report = job(settings, now)
        total += report.seconds
        counts = {k: v for k, v in report.counts.items() if v and k != "index_rows"}
        state = "skipped" if report.skipped else ", ".join(f"{k} {v}" for k, v in counts.items())
        print(f"  {name:<22} {report.seconds:8.2f} s   {state}")
    print(f"  {'total':<22} {total:8.2f} s")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="build the store here and keep it")
    args = parser.parse_args()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="maintenance-bench-"))
    (folder / "workspace").mkdir(parents=True, exist_ok=True)
    settings = Settings(
        workspace=folder / "workspace",
        db_path=folder / "memory.duckdb",
        index_dir=folder / "index",
    )
    now = datetime.now(UTC).replace(hour=4, minute=0, second=0, microsecond=0)
    try:
        started = time.perf_counter()
        table = generate(args.memories, args.conversations, now, args.seed)
        with open_store(settings.db_path) as con:
            insert_arrow(con, "memories", table)
        print(
            f"generated and inserted {table.num_rows} memories: "
            f"{time.perf_counter() - started:.1f} s"
        )
        started = time.perf_counter()
        embed_chunks(settings)
        index = build_search_index(settings)
        print(
            f"embedded and indexed {index.counts['rows']} documents: "
            f"{time.perf_counter() - started:.1f} s (before the clock starts)"
        )

        night(settings, now, "first night, fresh store")
        night(settings, now + timedelta(hours=1), "the same night again")
        night(settings, now + timedelta(days=1), "the next night")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
