"""Prompts of the write path's LLM steps and the pydantic models their JSON answers must fit:
fact extraction (seed 000 §4.2, §5.1, seed 003 §9) and reconciliation (seed 000 §4.3, §5.2).

Templates are plain `str.format` strings (literal braces doubled) so a missing or misspelt
placeholder fails at render time instead of reaching the model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, RootModel, field_validator

#: Seed 003 §9: one memory is at most this many characters.
MAX_FACT_CHARS = 280

# --- Fact extraction (seed 000 §4.2, §5.1 + seed 003 §9) ---------------------------------------

FACT_SYSTEM_PROMPT = """\
You extract durable facts about the user from the user's latest message, for a long-term memory.

Rules:
- Use only the user's own message. Ignore assistant and system text entirely.
- Extract 0 to 3 facts; up to 5 only when the message is long and holds that many distinct facts.
- Each fact is atomic: exactly one piece of information.
- Each fact is standalone and self-contained: readable without the conversation.
- Write in the third person about "the user", with no pronouns (no he, she, they, I, you, it):
  repeat the noun instead.
- Neutral tone, 1-2 sentences, at most 280 characters per fact.
- Keep durable information: identity, relationships, preferences, plans, goals, events, decisions.
- No greetings, acknowledgements, questions, small talk or requests to the assistant.
- If nothing is worth remembering, answer [].

Answer with a JSON list of strings and nothing else: no prose, no code fences.

Examples:
Message: "My wife is Anne"
Answer: ["The user's wife is named Anne."]
Message: "Hi, how are you?"
Answer: []
Message: "I moved to Lisbon last spring and I'm learning Portuguese."
Answer: ["The user moved to Lisbon in the spring of last year.", \
"The user is learning Portuguese."]
"""

# --- Reconciliation (seed 000 §4.3, §5.2) -------------------------------------------------------

UPDATE_MEMORY_PROMPT = """\
You manage a long-term memory. Compare the new facts with the existing memories and decide, \
for every memory, what happens to it.

Events:
- ADD: a new fact holds information not present in any existing memory. Give it a new id: the \
next integer after the highest existing id, counting up.
- UPDATE: a new fact refines or changes an existing memory about the same topic. Keep the \
existing id, put the improved text in "text" and the previous text in "old_memory".
- DELETE: a new fact explicitly contradicts an existing memory (for example "The user hates \
pizza" against "The user loves pizza"). Keep the id and the old text.
- NONE: the existing memory is unrelated to the new facts, or a new fact is an exact duplicate \
of it. Keep the id and the text unchanged.

Rules:
- Enumerate ALL memories in your answer: every existing memory exactly once with an event, and \
every new fact that is not a duplicate or an update as an ADD. Never omit a memory.
- New facts unrelated to any existing memory must be ADDed.
- Memory texts stay atomic, standalone, third person, with no pronouns, at most 280 characters.

Existing memories (JSON):
{existing_memories}

New facts (JSON):
{new_facts}

Answer with a JSON list and nothing else: no prose, no code fences. Each element is
{{"id": "<id>", "text": "<memory text>", "event": "ADD" | "UPDATE" | "DELETE" | "NONE", \
"old_memory": "<previous text, only for UPDATE>"}}
"""


# --- Answer models --------------------------------------------------------------------------------


class FactList(RootModel[list[str]]):
    """Fact extraction answer: a JSON list of strings. Blank entries are dropped."""

    @field_validator("root")
    @classmethod
    def _drop_blank(cls, facts: list[str]) -> list[str]:
        return [fact.strip() for fact in facts if fact.strip()]


MemoryEvent = Literal["ADD", "UPDATE", "DELETE", "NONE"]


class MemoryDecision(BaseModel):
    """One memory in the reconciliation answer and what happens to it."""

    # Models often write ids as numbers; they are compared as strings.
    model_config = ConfigDict(coerce_numbers_to_str=True)

    id: str
    text: str
    event: MemoryEvent
    old_memory: str | None = None

    @field_validator("event", mode="before")
    @classmethod
    def _upper_event(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value


class MemoryDecisionList(RootModel[list[MemoryDecision]]):
    """Reconciliation answer: every memory, existing and new, with its event."""
