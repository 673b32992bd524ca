"""The truth suite's engine: a scripted multi-session story against a fresh store, and what an
agent was told after each step, judged against what the story says is true.

A story is a list of steps (`stories/*.yaml`, read by `load_stories`): turns said in a session
(`say`), the agent's operations (`remember`, `correct`, `forget`, `confirm`, `restore`,
`procedure`, `decide` on a consent proposal), nightly runs at given days (`nightly`), a summary
run (`summarize`), and `check`s: the active memories expected, and context blocks for given
users and agents with the lines they must show and must not show. Every step runs on the
story's clock (`BASE` + days).

`run_story` runs a story with the rules (no LLM) or with `scripted_model`, a stand-in model on
the tests' OpenAI-compatible server, and counts, over every context block it builds:

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

import yaml

from memory_dag.config import Settings
from memory_dag.index.build import refresh_search_index
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.maintenance.nightly import run_nightly
from memory_dag.maintenance.procedures import remember_procedure
from memory_dag.memories import agent_ops, consent
from memory_dag.memories.categories import AccessDenied, load_categories
from memory_dag.memories.fact_rules import extract_facts_rules
from memory_dag.memories.prompts import FACT_SYSTEM_PROMPT
from memory_dag.memories.reconcile import ExistingMemory, reconcile_rules, relate
from memory_dag.memories.write_path import consolidate, link_pending_entities
from memory_dag.memories.writer import MemoryOpError
from memory_dag.read.context_block import build_context
from memory_dag.read.retriever import RetrievalConfig
from memory_dag.scope import Scope, UnknownCategory
from memory_dag.store.connection import fetch_dicts, open_store
from memory_dag.summaries.conversation_summaries import summarize_conversation
from memory_dag.summaries.summarizer import SummarizerConfig
from tests.openai_server import Reply

#: Day 0 of every story: a Monday morning.
BASE = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
#: Checks observe, they do not use memories (no access counts).
OBSERVE = RetrievalConfig(track_access=False)
_REMOVAL = re.compile(r"^- [×−](?:deleted|soft_deleted):")
_BULLET = re.compile(r"^- \S+?(created|updated|merged|deleted|soft_deleted|restored|confirmed): ")
_LABELLED = re.compile(r"^\[([^\]]+)\] (.*)$")


# --------------------------------------------------------------------------- steps


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


# --------------------------------------------------------------------------- the stand-in model


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


def run_story(story: Story, root: Path, llm_base_url: str | None = None) -> tuple[Tally, list[str]]:
    """Run one story in `root` (rules, or the stand-in model at `llm_base_url`)."""
    return StoryRun(story, root, llm_base_url).run()
