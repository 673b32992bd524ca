"""Cost per relation edge on the write path (seed 003 §2 target: <= 2 ms per edge).

    python benchmarks/relations.py [--data DIR] [--store-facts N] [--new-facts N]

Corpus: the facts the rule extractor finds in the LoCoMo dev conversations (real fact text,
WordLlama 256d vectors). Two stores: the real facts alone (the last 50 are the new ones), and
a store of `--store-facts` texts cycled with a numeric suffix (near-copies, so every new fact
gets the full 5 edges). The store's facts, all in one conversation, are written first; then
the new facts are added through `MemoryWriter.add`, which finds each fact's top-5 neighbours with
cosine >= LINK_MIN among the conversation's active facts and queues the edges, written in bulk
before COMMIT.

Two shapes, as the system uses them:
  * hot path: one transaction per fact (an agent's `remember`),
  * batch:    one transaction for all new facts (a consolidation run).

Reported: edges written, and milliseconds per edge for the relation work alone (neighbour
search + edge insert: `MemoryWriter.relation_seconds`) and for the whole write (memory row,
history, change log, entity links, edges, commit) divided by the edges.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.eval.locomo import _conversation, turn_text
from memory_dag.memories.fact_rules import extract_facts_rules
from memory_dag.memories.relations import LINK_MIN, LINK_TOP_K
from memory_dag.memories.writer import MemoryWriter, NewMemory
from memory_dag.store.connection import open_store

CONVERSATION = "bench"


def locomo_facts(data: Path) -> list[str]:
    facts: list[str] = []
    for path in sorted(data.glob("*.json")):
        conversation = _conversation(json.loads(path.read_text()))
        for key, turns in conversation.items():
            if key.startswith("session_") and isinstance(turns, list):
                for turn in turns:
                    found = extract_facts_rules(turn_text(turn), turn["speaker"], turn["dia_id"])
                    facts.extend(candidate.text for candidate in found)
    return list(dict.fromkeys(facts))


def corpus(facts: list[str], size: int, offset: int = 0) -> list[str]:
    """`size` distinct texts: the facts, then the facts again with a round number appended."""
    texts = []
    for i in range(offset, offset + size):
        base = facts[i % len(facts)]
        texts.append(base if i < len(facts) else f"{base[:-1]} (round {i // len(facts)}).")
    return texts


def write(writer: MemoryWriter, texts: list[str], *, per_fact: bool) -> float:
    """Add the texts; returns the wall time. One transaction per fact, or one for all."""
    started = time.perf_counter()
    if per_fact:
        for text in texts:
            with writer.transaction():
                writer.add(NewMemory(content=text, conversation_id=CONVERSATION))
    else:
        with writer.transaction():
            for text in texts:
                writer.add(NewMemory(content=text, conversation_id=CONVERSATION))
    return time.perf_counter() - started


def measure(facts: list[str], store_facts: int, new_facts: int, shape: str) -> None:
    provider = get_provider(Settings())
    with tempfile.TemporaryDirectory() as folder, open_store(Path(folder) / "m.duckdb") as con:
        writer = MemoryWriter(con, provider, actor="benchmark")
        writer.embed(corpus(facts, store_facts + new_facts))  # vectors are not what we time
        write(writer, corpus(facts, store_facts), per_fact=False)
        writer.facts(CONVERSATION)  # loaded, as the write path has it before adding
        before_edges = writer.counts.get("relations", 0)
        writer.relation_seconds = 0.0
        texts = corpus(facts, new_facts, store_facts)
        seconds = write(writer, texts, per_fact=shape == "hot path")
        edges = writer.counts.get("relations", 0) - before_edges
        assert con.execute("SELECT count(*) FROM relations").fetchone()[0] >= edges
    per_edge = 1000 * writer.relation_seconds / max(edges, 1)
    print(
        f"{store_facts:>6} {new_facts:>5} {shape:<9} {edges:>6} {edges / new_facts:>10.2f} "
        f"{per_edge:>18.3f} {1000 * seconds / max(edges, 1):>14.3f}"
    )


def run(data: Path, store_facts: int, new_facts: int) -> None:
    facts = locomo_facts(data)
    print(f"corpus: {len(facts)} distinct LoCoMo rule facts; LINK_MIN {LINK_MIN}, top {LINK_TOP_K}")
    print(f"{'store':>6} {'new':>5} {'shape':<9} {'edges':>6} {'edges/fact':>10} ", end="")
    print(f"{'relations ms/edge':>18} {'write ms/edge':>14}")
    # Real distinct facts only, then a larger store of cycled texts (near-copies link densely).
    for store, new in ((len(facts) - 50, 50), (store_facts, new_facts)):
        for shape in ("hot path", "batch"):
            measure(facts, store, new, shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/work/shared/datasets/locomo-dev", type=Path)
    parser.add_argument("--store-facts", type=int, default=1000)
    parser.add_argument("--new-facts", type=int, default=200)
    args = parser.parse_args()
    run(args.data, args.store_facts, args.new_facts)


if __name__ == "__main__":
    main()
