"""The truth suite's stories: the steps a story is made of, and the YAML files that hold
them (`stories/*.yaml`, one list of {name, covers, steps} each; a step is one key, the step's
kind, mapping to its fields; `day` is days after the stories' day 0, `harness.BASE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class Say:
    """Turns said in a session: (speaker, user_id or None, text), then a write-path run."""

    conversation: str
    session: str
    turns: list[tuple[str, str | None, str]]
    day: float = 0


@dataclass
class Remember:
    text: str
    user: str | None = None
    conversation: str | None = None
    category: str | None = None
    agent: str | None = None
    day: float = 0
    refused: bool = False  # the boundary must refuse it


@dataclass
class Correct:
    old: str
    new: str
    user: str | None = None
    day: float = 0
    conversation: str | None = None  # which memory of that text, when several say it


@dataclass
class Operate:
    """forget, confirm or restore the memory saying `text` (of `user`, in `conversation`)."""

    op: str
    text: str
    user: str | None = None
    day: float = 0
    refused: bool = False
    conversation: str | None = None


@dataclass
class Procedure:
    title: str
    steps: list[str]
    user: str | None = None
    conversation: str | None = None
    day: float = 0


@dataclass
class Decide:
    """Accept or reject the pending consent proposal whose proposed text is `proposed`."""

    proposed: str
    accept: bool
    user: str | None = None
    day: float = 0


@dataclass
class Nightly:
    day: float


@dataclass
class Summarize:
    conversation: str
    day: float = 0


@dataclass
class Context:
    """A context block to build and judge."""

    message: str
    conversation: str
    user: str | None = None
    agent: str | None = None
    shows: list[str] = field(default_factory=list)
    hides: list[str] = field(default_factory=list)  # in any line but a removal bullet
    refused: bool = False  # the scope boundary must refuse the read
    categories: list[str] | None = None  # asked for by name (e.g. procedural)


@dataclass
class Check:
    active: list[str] = field(default_factory=list)  # memories that must be active
    gone: list[str] = field(default_factory=list)  # memories that must not be active
    stale: list[str] = field(default_factory=list)  # never shown as current from now on
    pending: list[str] = field(default_factory=list)  # proposed texts waiting for consent
    once: list[str] = field(default_factory=list)  # active exactly once (no duplicate)
    contexts: list[Context] = field(default_factory=list)
    day: float = 0


Step = Say | Remember | Correct | Operate | Procedure | Decide | Nightly | Summarize | Check


@dataclass
class Story:
    name: str
    covers: str  # what the story is about, for the suite's listing
    steps: list[Step]


STORIES_DIR = Path(__file__).with_name("stories")
_STEPS: dict[str, Any] = {
    "say": Say,
    "remember": Remember,
    "correct": Correct,
    "procedure": Procedure,
    "decide": Decide,
    "nightly": Nightly,
    "summarize": Summarize,
}


def load_stories(folder: Path = STORIES_DIR) -> list[Story]:
    """Every story of the YAML files in `folder` (each a list of {name, covers, steps})."""
    stories = []
    for path in sorted(folder.glob("*.yaml")):
        for item in yaml.safe_load(path.read_text(encoding="utf-8")):
            steps = [
                _step(kind, fields) for entry in item["steps"] for kind, fields in entry.items()
            ]
            stories.append(Story(item["name"], item["covers"], steps))
    return stories


def _step(kind: str, fields: dict[str, Any]) -> Step:
    if kind in ("forget", "confirm", "restore"):
        return Operate(op=kind, **fields)
    if kind == "say":
        return Say(**{**fields, "turns": [tuple(turn) for turn in fields["turns"]]})
    if kind == "check":
        contexts = [Context(**context) for context in fields.get("contexts", [])]
        return Check(**{**fields, "contexts": contexts})
    return _STEPS[kind](**fields)
