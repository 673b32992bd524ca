"""Memory categories and per-agent allowlists (seed 003 §5), and the consent policy of
user-context fields (seed 003 §10), read from a YAML file.

Which categories an agent may read is decided here, on the server side: a request naming a
category outside the agent's allowlist is rejected as a whole, never silently narrowed, and
a request naming none reads the allowlist (without `procedural`, seed 003 §12).

The file is `categories.yaml` beside this module unless `MEMORY_DAG_CATEGORIES` names another.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from memory_dag.paths import resolved

DEFAULT_PATH = Path(__file__).with_name("categories.yaml")
ENV_VAR = "MEMORY_DAG_CATEGORIES"
PROCEDURAL = "procedural"


class AccessDenied(PermissionError):
    """A request asked for memories its agent (or user) may not read."""


class Category(BaseModel):
    name: str = Field(min_length=1)
    #: all: always in the agent's context block; rag: retrieved by relevance.
    context: Literal["all", "rag"] = "rag"
    #: At most this many memories of the category in one context block (rag only).
    rag_length: int | None = Field(None, ge=1)


class CategoryGroups(BaseModel):
    system: list[Category]
    custom: list[Category] = Field(default_factory=list)


class ConsentPolicy(BaseModel):
    """Seed 003 §10: which user-context fields need consent before a change applies.

    A change to a `sensitive` field is queued for `hold_days` and applied only on consent;
    a change to a `benign` field applies once `corroboration` turns said it (see
    `memory_dag/memories/consent.py` for the fields a fact can set).
    """

    sensitive: list[str] = Field(
        default_factory=lambda: ["preferred_name", "pronouns", "city", "language"]
    )
    benign: list[str] = Field(default_factory=lambda: ["tone"])
    hold_days: float = Field(7.0, gt=0)
    corroboration: int = Field(2, ge=1)


class CategoryConfig(BaseModel):
    """The parsed YAML: categories, the category of uncategorised rows, agents' allowlists, and
    the consent policy of user-context fields."""

    categories: CategoryGroups
    #: Transcript turns and notes have no category; they are readable as this one.
    uncategorized: str | None = None
    allowlists: dict[str, list[str]]
    consent: ConsentPolicy = Field(default_factory=ConsentPolicy)

    @model_validator(mode="after")
    def _consistent(self) -> CategoryConfig:
        names = [c.name for c in self.all()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"categories defined twice: {', '.join(duplicates)}")
        known = set(names)
        if self.uncategorized is not None and self.uncategorized not in known:
            raise ValueError(f"uncategorized: {self.uncategorized!r} is not a defined category")
        for agent, allowed in self.allowlists.items():
            unknown = sorted(set(allowed) - known)
            if unknown:
                raise ValueError(f"allowlist of {agent!r} names undefined {', '.join(unknown)}")
        return self

    def all(self) -> list[Category]:
        return [*self.categories.system, *self.categories.custom]

    def get(self, name: str) -> Category:
        return next(c for c in self.all() if c.name == name)

    def allowlist(self, agent: str) -> list[str]:
        if agent not in self.allowlists:
            agents = ", ".join(sorted(self.allowlists))
            raise AccessDenied(f"unknown agent {agent!r}: no allowlist (agents: {agents})")
        return list(self.allowlists[agent])

    def resolve(self, agent: str, requested: list[str] | None) -> list[str]:
        """The categories a request reads: `requested` if ⊆ the allowlist, else AccessDenied."""
        allowed = self.allowlist(agent)
        if not requested:
            return [c for c in allowed if c != PROCEDURAL]
        known = {c.name for c in self.all()}
        unknown = [c for c in requested if c not in known]
        if unknown:
            raise AccessDenied(
                f"unknown categories {unknown} (defined: {', '.join(sorted(known))})"
            )
        denied = [c for c in requested if c not in allowed]
        if denied:
            raise AccessDenied(f"agent {agent!r} may not read {denied}; its allowlist is {allowed}")
        return list(dict.fromkeys(requested))


def load_categories(path: Path | str | None = None) -> CategoryConfig:
    """The category file at `path`, `$MEMORY_DAG_CATEGORIES`, or the packaged default."""
    chosen = Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)
    return _load(resolved(chosen), chosen.stat().st_mtime_ns)


@lru_cache(maxsize=8)
def _load(path: Path, mtime_ns: int) -> CategoryConfig:
    """Parsed once per file version (the mtime is part of the cache key)."""
    return CategoryConfig.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
