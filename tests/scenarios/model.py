"""A deterministic stand-in for an LLM on the tests' OpenAI-compatible server: the truth
suite's "scripted LLM". It answers each prompt of the pipeline in the format it asks for, as
a careful model would.
"""

from __future__ import annotations

import json
import re
from typing import Any

from memory_dag.memories.fact_rules import extract_facts_rules
from memory_dag.memories.prompts import FACT_SYSTEM_PROMPT
from memory_dag.memories.reconcile import ExistingMemory, reconcile_rules, relate
from tests.openai_server import Reply


def scripted_model(body: dict[str, Any]) -> Reply:
    """A deterministic stand-in for an LLM, answering each prompt of the pipeline in its format:
    extraction (the facts a careful model would write, "the user" for the speaker),
    reconciliation (a full enumeration, decided as a careful model would), summaries (the
    turns and facts that still hold), merges, reflections and insights."""
    messages = body["messages"]
    first, last = messages[0]["content"], messages[-1]["content"]
    if first == FACT_SYSTEM_PROMPT:
        return Reply.json([f.text for f in extract_facts_rules(last, None, "t")])
    if "Existing memories (JSON):" in last:
        return Reply.json(_reconcile_answer(last))
    if "decide whether A and B state the same fact" in last:
        pairs = json.loads(last.split("Pairs (JSON):\n", 1)[1].split("\n\nAnswer", 1)[0])
        return Reply.json(
            [
                # the pairs passed the cosine pre-filter (>= 0.75): judged as such
                {"pair": p["pair"], "same": relate(p["b"], p["a"], 0.9)[0] != "unrelated"}
                for p in pairs
            ]
        )
    if '"insights"' in last:
        return Reply.json({"insights": []})
    if "this week's reflection" in last:
        facts = re.findall(r"^- (.*)$", last.split("Conversation turns")[0], re.MULTILINE)
        return Reply.text(" ".join(facts[:3]) or "A quiet week.")
    return Reply.text(_summary(last))


def _reconcile_answer(prompt: str) -> list[dict[str, str]]:
    existing = json.loads(prompt.split("Existing memories (JSON):\n", 1)[1].split("\n\nNew", 1)[0])
    facts = json.loads(prompt.split("New facts (JSON):\n", 1)[1].split("\n\nAnswer", 1)[0])
    neighbours = [ExistingMemory(m["id"], m["text"]) for m in existing]
    decisions = reconcile_rules(facts, None, neighbours)
    by_id = {d.memory_id: d for d in decisions if d.memory_id is not None}
    answer = []
    for memory in existing:
        decision = by_id.get(memory["id"])
        event = decision.event if decision else "NONE"
        text = decision.text if decision and event == "UPDATE" else memory["text"]
        answer.append({"id": memory["id"], "text": text, "event": event})
    adds = [d for d in decisions if d.event == "ADD"]
    answer += [
        {"id": str(len(existing) + i), "text": d.text, "event": "ADD"} for i, d in enumerate(adds)
    ]
    return answer


def _summary(prompt: str) -> str:
    """What still holds: the facts listed, else the last turns not marked superseded."""
    facts = re.findall(r"^- (.*)$", prompt.split("Facts noted since the last summary:")[-1], re.M)
    if "Facts noted since the last summary:" in prompt and facts:
        return " ".join(facts)
    turns = [
        line
        for line in prompt.splitlines()
        if re.match(r"^[A-Z][\w'-]*: ", line) and not line.startswith("[superseded]")
    ]
    return " ".join(turns[-2:]) or "A short conversation."
