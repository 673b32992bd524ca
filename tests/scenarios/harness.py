"""The truth suite's engine: a scripted multi-session story against a fresh store, and what an
agent was told after each step, judged against what the story says is true.

A story is a list of steps (`stories/*.yaml`, read by `steps.load_stories`): turns said in a session
(`say`), the agent's operations (`remember`, `correct`, `forget`, `confirm`, `restore`,
`procedure`, `decide` on a consent proposal), nightly runs at given days (`nightly`), a summary
run (`summarize`), and `check`s: the active memories expected, and context blocks for given
users and agents with the lines they must show and must not show. Every step runs on the
story's clock (`BASE` + days).

`run_story` runs a story with the rules (no LLM) or with `model.scripted_model`, a stand-in
model on the tests' OpenAI-compatible server, and counts, over every context block it builds:

* stale facts shown: a line showing as current a memory no longer active, or a text the story
  declares stale (a statement overruled later);
* replaced facts shown as current: such a line for a memory replaced by a correction, an
  update or a merge;
* out-of-scope memories shown: a line of a memory owned by another user, of a category outside
  the agent's allowlist (read from the categories file), of another conversation, or a
  procedure's steps nobody asked for;
* memories lost: an expected active memory that is not active, or an expected line missing.

These judgements read the store's rows and the categories file directly, not the scope
boundary they judge. `benchmarks/truth_suite.py` prints the four figures over all stories.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memory_dag.config import Settings
from memory_dag.index.build import refresh_search_index
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.maintenance.nightly import run_nightly
from memory_dag.maintenance.procedures import remember_procedure
from memory_dag.memories import agent_ops, consent
from memory_dag.memories.categories import AccessDenied, load_categories
from memory_dag.memories.write_path import consolidate, link_pending_entities
from memory_dag.memories.writer import MemoryOpError
from memory_dag.read.context_block import build_context
from memory_dag.read.retriever import RetrievalConfig
from memory_dag.scope import Scope, UnknownCategory
from memory_dag.store.connection import fetch_dicts, open_store
from memory_dag.summaries.refresh import summarize_conversation
from memory_dag.summaries.summarizer import SummarizerConfig
from tests.scenarios.model import scripted_model
from tests.scenarios.steps import (
    Check,
    Context,
    Correct,
    Decide,
    Nightly,
    Operate,
    Procedure,
    Remember,
    Say,
    Story,
    Summarize,
    load_stories,
)

__all__ = ["BASE", "FIGURES", "StoryRun", "Tally", "load_stories", "run_story", "scripted_model"]

#: Day 0 of every story: a Monday morning.
BASE = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
#: Checks observe, they do not use memories (no access counts).
OBSERVE = RetrievalConfig(track_access=False)
_REMOVAL = re.compile(r"^- [×−](?:deleted|soft_deleted):")
_BULLET = re.compile(r"^- \S+?(created|updated|merged|deleted|soft_deleted|restored|confirmed): ")
_LABELLED = re.compile(r"^\[([^\]]+)\] (.*)$")


# --------------------------------------------------------------------------- results


#: The figures, in the order they are printed.
FIGURES = ("stale_shown", "replaced_shown", "out_of_scope_shown", "lost")


@dataclass
class Tally:
    """The four figures of the truth suite (`counts`), and every problem behind them."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIGURES, 0))
    blocks: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for figure, value in other.counts.items():
            self.counts[figure] += value
        self.blocks += other.blocks
        self.problems += other.problems

    def note(self, figure: str, detail: str) -> None:
        self.counts[figure] += 1
        self.problems.append(f"{figure}: {detail}")


# --------------------------------------------------------------------------- running a story


class StoryRun:
    """One story against one store; `run()` returns the tally and the failed expectations."""

    def __init__(self, story: Story, root: Path, llm_base_url: str | None = None) -> None:
        self.story = story
        workspace = root / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        llm = {"llm_base_url": llm_base_url, "llm_model": "scripted-model"} if llm_base_url else {}
        self.settings = Settings(
            workspace=workspace, db_path=root / "memory.duckdb", index_dir=root / "index", **llm
        )
        self.transcripts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.stale: set[str] = set()
        self.dirty = True
        self.tally = Tally()
        self.failures: list[str] = []
        self.categories = load_categories()

    def run(self) -> tuple[Tally, list[str]]:
        for number, step in enumerate(self.story.steps):
            handler = getattr(self, f"_{type(step).__name__.lower()}")
            handler(step, f"{self.story.name} step {number} ({type(step).__name__})")
        return self.tally, self.failures

    def _at(self, day: float) -> datetime:
        return BASE + timedelta(days=day)

    # --- steps ---------------------------------------------------------------------------

    def _say(self, step: Say, where: str) -> None:
        lines = self.transcripts.setdefault((step.conversation, step.session), [])
        for speaker, user, text in step.turns:
            number = len(lines)
            line: dict[str, Any] = {
                "role": "assistant" if speaker == "Iris" else "user",
                "name": speaker,
                "id": f"{step.session}-{number}",
                "content": text,
                "created_at": (self._at(step.day) + timedelta(minutes=number)).isoformat(),
            }
            if user is not None:
                line["user_id"] = user
            lines.append(line)
        path = self.settings.workspace / "sessions" / step.conversation / f"{step.session}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
        sync_files(self.settings)
        build_chunks(self.settings)
        consolidate(self.settings, now=self._at(step.day))
        link_pending_entities(self.settings)
        self.dirty = True

    def _remember(self, step: Remember, where: str) -> None:
        scope = Scope.of(user_id=step.user, conversation_id=step.conversation, agent=step.agent)
        self._attempt(
            where,
            step.refused,
            lambda: agent_ops.remember(
                self.settings, step.text, scope=scope, category=step.category, refresh=False,
                now=self._at(step.day),
            ),
        )  # fmt: skip

    def _correct(self, step: Correct, where: str) -> None:
        memory_id = self._memory_id(step.old, step.user, step.conversation)
        self._attempt(
            where,
            False,
            lambda: agent_ops.correct(
                self.settings, memory_id, step.new, scope=Scope.of(user_id=step.user),
                refresh=False, now=self._at(step.day),
            ),
        )  # fmt: skip

    def _operate(self, step: Operate, where: str) -> None:
        memory_id = self._memory_id(step.text, step.user, step.conversation)
        operation = {
            "forget": agent_ops.forget,
            "confirm": agent_ops.confirm,
            "restore": agent_ops.restore,
        }[step.op]
        options = {"refresh": False} if step.op != "confirm" else {}
        self._attempt(
            where,
            step.refused,
            lambda: operation(
                self.settings, memory_id, scope=Scope.of(user_id=step.user),
                now=self._at(step.day), **options,
            ),
        )  # fmt: skip

    def _procedure(self, step: Procedure, where: str) -> None:
        remember_procedure(
            self.settings, step.steps, title=step.title, conversation_id=step.conversation,
            user_id=step.user, refresh=False,
        )  # fmt: skip
        self.dirty = True

    def _decide(self, step: Decide, where: str) -> None:
        scope = Scope.of(user_id=step.user)
        now = self._at(step.day)
        waiting = [
            p
            for p in consent.list_proposals(self.settings, scope=scope, now=now)
            if p.proposed_text == step.proposed
        ]
        if not waiting:
            self.failures.append(f"{where}: no pending proposal {step.proposed!r}")
            return
        consent.decide(
            self.settings, waiting[0].id, step.accept, scope=scope, now=now, refresh=False
        )
        self.dirty = True

    def _nightly(self, step: Nightly, where: str) -> None:
        run_nightly(self.settings, self._at(step.day))
        self.dirty = True

    def _summarize(self, step: Summarize, where: str) -> None:
        config = SummarizerConfig.from_settings(self.settings)
        summarize_conversation(self.settings, step.conversation, config=config)
        self.dirty = True

    def _attempt(self, where: str, refused: bool, action: Any) -> None:
        try:
            action()
        except (AccessDenied, UnknownCategory, MemoryOpError) as error:
            if not refused:
                self.failures.append(f"{where}: refused: {error}")
            return
        if refused:
            self.failures.append(f"{where}: should have been refused")
        self.dirty = True

    # --- checks --------------------------------------------------------------------------

    def _check(self, step: Check, where: str) -> None:
        if self.dirty:
            refresh_search_index(self.settings)
            self.dirty = False
        self.stale.update(step.stale)
        rows = self._rows()
        active = {_bare(r["content"]) for r in rows if r["state"] == "active"}
        for text in step.active:
            if _bare(text) not in active:
                self.tally.note("lost", f"{where}: {text!r} is not an active memory")
                self.failures.append(f"{where}: expected active: {text!r}")
        for text in step.gone:
            if _bare(text) in active:
                self.failures.append(f"{where}: expected gone: {text!r}")
        for text in step.once:
            copies = sum(
                1 for r in rows if r["state"] == "active" and _bare(r["content"]) == _bare(text)
            )
            if copies != 1:
                self.failures.append(f"{where}: {text!r} is active {copies} times, not once")
        if step.pending:
            proposed = {
                p.proposed_text
                for user in {r["user_id"] for r in rows}
                for p in consent.list_proposals(
                    self.settings, scope=Scope.of(user_id=user), now=self._at(step.day)
                )
            }
            missing = [text for text in step.pending if text not in proposed]
            if missing:
                self.failures.append(f"{where}: expected pending proposals {missing}")
        for context in step.contexts:
            self._context(context, rows, self._at(step.day), where)

    def _context(
        self, context: Context, rows: list[dict[str, Any]], now: datetime, where: str
    ) -> None:
        label = f"{where} context for user={context.user} agent={context.agent}"
        try:
            scope = Scope.of(
                user_id=context.user,
                agent=context.agent,
                conversation_id=context.conversation,
                categories=context.categories,
            )
            block = build_context(
                context.message, scope, settings=self.settings, config=OBSERVE, now=now,
                max_tokens=1500, max_memories=8, min_score=0.0, since_rev=0,
            )  # fmt: skip
        except AccessDenied as error:
            if not context.refused:
                self.failures.append(f"{label}: refused: {error}")
            return
        if context.refused:
            self.failures.append(f"{label}: should have been refused")
            self.tally.note("out_of_scope_shown", f"{label}: answered a read it must refuse")
            return
        self.tally.blocks += 1
        text = block.text
        for expected in context.shows:
            if expected not in text:
                self.tally.note("lost", f"{label}: {expected!r} not shown")
                self.failures.append(f"{label}: expected to show {expected!r}\n{text}")
        # What is gone may be said to be gone (seed 003 §7: the delta header surfaces a removal
        # once); `hides` is about everything else.
        told = "\n".join(line for line in text.splitlines() if not _REMOVAL.match(line))
        for hidden in context.hides:
            if hidden in told:
                self.failures.append(f"{label}: must not show {hidden!r}\n{text}")
        self._judge(block.text, context, rows, label)

    def _judge(self, text: str, context: Context, rows: list[dict[str, Any]], label: str) -> None:
        """Count stale, replaced and out-of-scope lines (see the module doc)."""
        allowlist = (
            set(self.categories.allowlist(context.agent)) if context.agent is not None else None
        )
        uncategorized = self.categories.uncategorized
        for line in text.splitlines():
            removal = bool(_REMOVAL.match(line))
            category, body = _parse_line(line)
            if category is None and body is None:
                continue
            matched = _matching(rows, body or "")
            current = not removal
            for stale in self.stale:
                if current and _bare(stale) and _bare(stale) in _bare(line):
                    self.tally.note("stale_shown", f"{label}: {line!r} (declared stale)")
            if matched and current and all(r["state"] != "active" for r in matched):
                kind = "replaced_shown" if all(r["replaced_by"] for r in matched) else "stale_shown"
                self.tally.note(kind, f"{label}: {line!r} is no longer active")
            others = [
                r["kind"] != "episode" and r["user_id"] not in (None, context.user) for r in matched
            ]
            if matched and context.user is not None and all(others):
                self.tally.note("out_of_scope_shown", f"{label}: {line!r} is another user's")
            if matched and all(
                r["conversation_id"] not in (context.conversation, None) and r["user_id"] is None
                for r in matched
            ):
                self.tally.note(
                    "out_of_scope_shown", f"{label}: {line!r} is another conversation's"
                )
            asked = "procedural" in (context.categories or [])
            if not asked and any(r["kind"] == "procedural" for r in matched):
                self.tally.note("out_of_scope_shown", f"{label}: {line!r} is a procedure's steps")
            if allowlist is not None and category is not None:
                named = uncategorized if category in ("user", "assistant") else category
                if named not in allowlist:
                    self.tally.note(
                        "out_of_scope_shown", f"{label}: {line!r} outside {context.agent}'s list"
                    )

    # --- store lookups -------------------------------------------------------------------

    def _rows(self) -> list[dict[str, Any]]:
        with open_store(self.settings.db_path, read_only=True) as con:
            return fetch_dicts(
                con,
                "SELECT id, kind, content, speaker, user_id, conversation_id, category, state, "
                "replaced_by FROM memories",
            )

    def _memory_id(self, text: str, user: str | None, conversation: str | None) -> str:
        """The memory saying `text` (of this user, in this conversation when given), the
        active one first."""
        rows = [
            r
            for r in self._rows()
            if _bare(r["content"]) == _bare(text)
            and (user is None or r["user_id"] == user)
            and (conversation is None or r["conversation_id"] == conversation)
        ]
        rows.sort(key=lambda r: r["state"] != "active")
        if not rows:
            raise AssertionError(f"{self.story.name}: no memory says {text!r}")
        return rows[0]["id"]


def _bare(text: str) -> str:
    return " ".join(text.split()).rstrip(". ").lower()


def _parse_line(line: str) -> tuple[str | None, str | None]:
    """(category or role label, memory text) of a block line; (None, None) for headings."""
    if line.startswith("## ") or line.startswith("Memory updates since rev"):
        return None, None
    bullet = _BULLET.match(line)
    if bullet:
        line = line[bullet.end() :]
        line = re.sub(r" \(imp=\d\)$", "", line)
    labelled = _LABELLED.match(line)
    if labelled:
        return labelled.group(1), labelled.group(2)
    return None, line  # a summary or reflection paragraph, or an uncategorised bullet


def _matching(rows: list[dict[str, Any]], body: str) -> list[dict[str, Any]]:
    """Memories whose text the line shows (a turn is shown as `Speaker: text`)."""
    key = _bare(body)
    found = []
    for row in rows:
        content = _bare(row["content"])
        shown = _bare(f"{row['speaker']}: {row['content']}") if row["speaker"] else content
        if key in (content, shown):
            found.append(row)
    return found


def run_story(story: Story, root: Path, llm_base_url: str | None = None) -> tuple[Tally, list[str]]:
    """Run one story in `root` (rules, or the stand-in model at `llm_base_url`)."""
    return StoryRun(story, root, llm_base_url).run()
