"""The write path: what people say becomes facts as the turns arrive, kept consistent over time.

Each user turn is examined once, as it arrives (seed 000 §4: extraction after each turn): a run
observes the new turns of each conversation's open (newest) session, and consolidates the
sessions that closed (`sessions.py` decides which), re-checking what the live path could not
do: turns not examined yet, and turns whose extraction failed (seed 004's session-close batch
path). `write_turns` is the per-turn step as a library function over an open `MemoryWriter`, for
any live write path. Turn by turn, in the order they were said (user turns only, seed 000 §4.2):

1. Extraction: `extract_facts_llm` when an LLM is configured, else `extract_facts_rules` (the run
   says which). An LLM failure means no facts for that turn and an `events` row.
2. Two-level dedup and the write cap (`select_for_write`): exact within the turn's batch, word
   Jaccard >= 0.75 against the conversation's active facts, then at most 3 writes.
3. Neighbourhood: the 5 active facts of the conversation nearest by cosine (the embedding
   provider's vectors, cached in `embedding_cache`), plus up to 5 sharing the most words (Jaccard
   >= 0.2). The word candidates matter: "loves pizza" / "hates pizza" embed close, but
   "lives in Paris" / "lives in Berlin" do not (cosine 0.44 with WordLlama).
4. Reconciliation (`reconcile_llm` or `reconcile_rules`), then execution through `MemoryWriter`:
   ADD inserts, UPDATE soft-deletes the old fact (`replaced_by`) and inserts the new one
   (`supersedes`), DELETE soft-deletes (history `new_ref` = the fact that contradicted it),
   NONE for a duplicate is recorded in `history` without any change. A failed LLM call adds
   every fact and leaves an `events` row.

A fact carries the turn's conversation, session, speaker, role, time and user (a transcript
line's `user_id`; the fact is then that user's, `memory_dag/scope.py`), and `source_ids` = the
episode id of its turn. Neighbours are facts of the same owner only (the user, else the
conversation), so one user's statement never updates or deletes another user's fact.

Sessions are written in all-or-nothing batches, so a crash leaves them pending. An LLM's
extraction runs before the store is opened, so its latency does not hold DuckDB's write lock
(reconciliation calls do, within a batch of at most `LOCK_HOLD_SECONDS`); the rules run in
worker processes while the first sessions are reconciled (`ArrivingExtractions`).

Kept as one module (~800 lines): one run, read -> extract -> reconcile -> write per batch of
sessions, live and closing alike; the sessions themselves are in `sessions.py`, the consent
gate that holds changes of user-context fields in `consent.py`.

Why one module: per-turn writes, session consolidation and pending entity links
are the three steps of one flow over one `TurnWriter` and its session marks.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

import pyarrow as pa

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.ids import text_hash
from memory_dag.llm import LLMClient, LLMConfig, LLMError
from memory_dag.memories.categories import CategoryConfig, load_categories
from memory_dag.memories.consent import ConsentGate
from memory_dag.memories.fact_rules import extract_facts_rules_batch
from memory_dag.memories.facts import (
    FactCandidate,
    classify_fact,
    extract_facts_llm,
    select_for_write,
    validate_fact,
)
from memory_dag.memories.fold import fold_journal
from memory_dag.memories.reconcile import (
    Decision,
    ExistingMemory,
    jaccard_to_each,
    reconcile_llm,
    reconcile_rules,
)
from memory_dag.memories.relations import FactSet
from memory_dag.memories.sessions import (
    NODE,
    Session,
    load_sessions,
    register_sessions,
    reopen_changed_sessions,
    sessions_due,
)
from memory_dag.memories.writer import FACT_DECAY_RATE, MemoryWriter, NewMemory, new_memory_id
from memory_dag.parallel import process_map, process_map_iter
from memory_dag.reports import StageReport
from memory_dag.scope import known_category, owner_key
from memory_dag.store.connection import fetch_dicts, listed, open_store, registered

ACTOR = "write_path"
NEIGHBOURS_BY_VECTOR = 5
NEIGHBOURS_BY_WORDS = 5
MIN_NEIGHBOUR_JACCARD = 0.2
#: A consolidation run releases DuckDB's write lock at least this often (see `_write_sessions`).
LOCK_HOLD_SECONDS = 5.0
PREVIEW_ROWS = 10

_COUNT_KEYS = (
    "sessions_registered",
    "sessions_reopened",
    "sessions_consolidated",
    "sessions_observed",
    "sessions_open",
    "turns_examined",
    "candidates",
    "facts_added",
    "facts_updated",
    "facts_deleted",
    "facts_unchanged",
    "facts_rejected",
    "facts_proposed",
    "entities_created",
    "entity_links",
    "relations",
    "llm_failures",
)


@dataclass
class WriteReport(StageReport):
    """A `StageReport` plus the method that ran (llm | rules) and per-step seconds."""

    method: str = "rules"
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UserTurn:
    """A user turn (an episode) waiting to be examined."""

    episode_id: str
    turn_id: str
    path: str
    conversation_id: str | None
    session_id: str | None
    speaker: str | None
    role: str
    content: str
    event_time: datetime | None
    #: The user the turn's facts belong to (a transcript line's `user_id`); None: shared.
    user_id: str | None = None

    @cached_property
    def key(self) -> str:
        """Identifies this turn with this text: an edited turn is a new turn to examine
        (computed once: a run looks each turn up by it several times)."""
        return f"{self.episode_id}:{text_hash(self.content)[:16]}"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _pending_turns(con: Any, sessions: list[Session]) -> dict[str, list[UserTurn]]:
    """User turns of these sessions that no earlier run examined (live or at close), in order."""
    paths = [s.path for s in sessions]
    if not paths:
        return {}
    examined: set[str] = set()
    with listed(con, "_paths", paths):
        for (meta,) in con.execute(
            "SELECT meta FROM events WHERE node = ? AND op IN ('consolidate', 'observe') "
            "AND json_extract_string(meta, '$.path') IN (SELECT value FROM _paths)",
            [NODE],
        ).fetchall():
            examined.update(json.loads(meta).get("turns", []))
        # The time as microseconds since the epoch: DuckDB's own conversion of a TIMESTAMPTZ
        # (a pytz zone per value) cost more than the rest of the query.
        rows = con.execute(
            "SELECT id, turn_id, path, conversation_id, session_id, speaker, source_role, "
            "content, epoch_us(event_time), user_id FROM memories WHERE kind = 'episode' "
            "AND source_role = 'user' AND path IN (SELECT value FROM _paths) ORDER BY path, line"
        ).fetchall()
    pending: dict[str, list[UserTurn]] = {path: [] for path in paths}
    for *head, micros, user_id in rows:
        said_at = None if micros is None else _EPOCH + timedelta(microseconds=micros)
        turn = UserTurn(*head, said_at, user_id)
        # A turn's key hashes its text: not before the workers start when nothing was examined
        # (a first run), as `ArrivingExtractions` hashes it once they have.
        if not examined or turn.key not in examined:
            pending[turn.path].append(turn)
    return pending


# --------------------------------------------------------------------------- consolidation


def llm_client(settings: Settings) -> LLMClient | None:
    """The configured LLM, or None: the non-LLM methods run instead."""
    config = LLMConfig.from_settings(settings)
    return LLMClient(config) if config is not None else None


#: A turn's fact candidates, the LLM error if extraction failed, and the facts the writing
#: rules rejected (seed 003 §9: counted as `facts_rejected`).
Extracted = tuple[list[FactCandidate], LLMError | None, list[str]]


def extract_turns(llm: LLMClient | None, turns: list[UserTurn]) -> list[Extracted]:
    """Fact candidates of each turn (LLM calls run on the client's bounded thread pool; the
    rules, on many turns, in worker processes)."""
    if llm is None:
        said = [(t.content, t.speaker, t.turn_id) for t in turns]
        found = process_map(extract_facts_rules_batch, said)
        return [(candidates, None, rejected) for candidates, rejected in found]

    def extract(turn: UserTurn) -> Extracted:
        rejected: list[str] = []
        found, error = extract_facts_llm(llm, turn.content, turn.speaker, turn.turn_id, rejected)
        return found, error, rejected

    return llm.map(extract, turns)


class ArrivingExtractions(Mapping[str, Extracted]):
    """Each turn's extraction by `UserTurn.key`, taken from `results` (in the order of
    `turns`) when first asked for: the write path reconciles the first sessions while the
    worker processes still extract the later ones. `waited` is the time spent waiting."""

    def __init__(self, turns: Sequence[UserTurn], results: Iterator[Extracted]) -> None:
        keys = [turn.key for turn in turns]
        self._keys = iter(keys)
        self._count = len(set(keys))
        self._results = results
        self._arrived: dict[str, Extracted] = {}
        self.waited = 0.0

    def __getitem__(self, key: str) -> Extracted:
        if key in self._arrived:
            return self._arrived[key]
        started = time.perf_counter()
        try:
            while key not in self._arrived:
                next_key = next(self._keys, None)
                if next_key is None:
                    raise KeyError(key)
                self._arrived[next_key] = self._next_result()
        finally:
            self.waited += time.perf_counter() - started
        return self._arrived[key]

    def _next_result(self) -> Extracted:
        result = next(self._results, None)
        if result is None:
            raise RuntimeError("the extraction gave fewer results than there are turns")
        return result

    def __iter__(self) -> Iterator[str]:
        for key in self._keys:  # takes every result (the write path looks keys up instead)
            self._arrived[key] = self._next_result()
        return iter(self._arrived)

    def __len__(self) -> int:
        return self._count


def neighbourhood(facts: FactSet, texts: list[str], vectors: Any) -> list[ExistingMemory]:
    """Active facts to reconcile against: nearest by cosine plus most word overlap."""
    chosen: dict[int, None] = {}
    for text, vector in zip(texts, vectors, strict=True):
        for position, _ in facts.similar(vector, NEIGHBOURS_BY_VECTOR):
            chosen[position] = None
        scores = jaccard_to_each(text, facts.texts)
        overlap = heapq.nlargest(  # = sorted(..., reverse=True)[:NEIGHBOURS_BY_WORDS]
            NEIGHBOURS_BY_WORDS, zip(scores, range(len(scores)), strict=True)
        )
        for score, position in overlap:
            if score >= MIN_NEIGHBOUR_JACCARD:
                chosen[position] = None
    return [ExistingMemory(facts.ids[i], facts.texts[i], facts.vectors[i]) for i in chosen]


class TurnWriter:
    """Reconciles and writes the facts of user turns inside the writer's open transaction."""

    def __init__(
        self,
        writer: MemoryWriter,
        llm: LLMClient | None,
        method: str,
        counts: dict[str, int],
        gate: ConsentGate | None = None,
        categories: CategoryConfig | None = None,
    ) -> None:
        self.writer = writer
        self.llm = llm
        self.method = method
        self.counts = counts
        self.timings: dict[str, float] = {"reconcile": 0.0, "write": 0.0}
        self.written: list[str] = []
        #: Keys of turns whose extraction failed: not examined, so a later run retries them.
        self.failed: list[str] = []
        self.consent = gate or ConsentGate(writer)
        #: `categories.yaml`, read once for these turns (not once a fact: it stats the file);
        #: a consolidation passes the copy its batch of sessions read.
        self.categories = categories if categories is not None else load_categories()

    def _count(self, key: str, amount: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    def turn(
        self,
        turn: UserTurn,
        candidates: list[FactCandidate],
        error: LLMError | None,
        rejected: list[str] | None = None,
    ) -> None:
        self._count("turns_examined")
        self._count("candidates", len(candidates))
        self._count("facts_rejected", len(rejected or []))
        if error is not None:
            self.failed.append(turn.key)
            self.writer.record_event(
                NODE,
                "extract",
                "error",
                conversation_id=turn.conversation_id,
                memory_id=turn.episode_id,
                detail=str(error),
                meta={"kind": error.kind, "path": turn.path, "turn_id": turn.turn_id},
            )
        if not candidates:  # most turns: nothing to look up
            return
        facts = self.writer.facts(owner_key(turn.user_id, turn.conversation_id))
        fresh = select_for_write(candidates, facts.texts)
        self._count("facts_unchanged", len(candidates) - len(fresh))
        if not fresh:
            return
        started = time.perf_counter()
        texts = [candidate.text for candidate in fresh]
        vectors = self.writer.embed(texts)
        neighbours = neighbourhood(facts, texts, vectors)
        if self.llm is None:
            decisions = reconcile_rules(texts, vectors, neighbours)
        else:
            decisions, failure = reconcile_llm(self.llm, texts, neighbours)
            if failure is not None:
                self.writer.record_event(
                    "reconcile",
                    "reconcile",
                    "error",
                    conversation_id=turn.conversation_id,
                    memory_id=turn.episode_id,
                    detail=str(failure),
                    meta={"kind": failure.kind, "facts": texts, "fallback": "added all"},
                )
        middle = time.perf_counter()
        self.execute(turn, fresh, decisions)
        self.timings["reconcile"] += middle - started
        self.timings["write"] += time.perf_counter() - middle

    def execute(
        self, turn: UserTurn, fresh: list[FactCandidate], decisions: list[Decision]
    ) -> None:
        """Apply decisions: deletions first, so a new fact never links to what it contradicts.

        A change to a user-context field fact (`consent.py`) becomes a proposal instead.
        """
        held = self.consent.hold(
            decisions,
            self.writer.facts(owner_key(turn.user_id, turn.conversation_id)),
            lambda text, index: fact_memory(
                turn, text, fresh[index] if index is not None else None, self.categories
            ),
        )
        decisions = held.decisions
        self._count("facts_proposed", held.proposed)
        self._count("facts_updated", len(held.applied))
        self.written += held.applied
        base = {
            "method": self.method,
            "session": turn.path,
            "turn_id": turn.turn_id,
            "episode_id": turn.episode_id,
        }
        writes: list[tuple[Decision, str, str]] = []  # decision, valid text, new id
        for decision in decisions:
            if decision.event in ("ADD", "UPDATE"):
                text = validate_fact(decision.text)
                if text is None:
                    self._count("facts_rejected")
                else:
                    writes.append((decision, text, new_memory_id("fact")))
        added = [(d.fact_index, new_id) for d, _, new_id in writes if d.event == "ADD"]
        added_for = {index: new_id for index, new_id in added if index is not None}
        for decision in decisions:
            meta = {**base, "reason": decision.reason, "similarity": decision.similarity}
            if decision.event == "DELETE":
                # The contradicting fact; an LLM does not say which, so only when unambiguous.
                new_ref = added_for.get(decision.fact_index)
                if new_ref is None and len(added) == 1:
                    new_ref = added[0][1]
                self.writer.soft_delete(decision.memory_id, new_ref=new_ref, meta=meta)
                self._count("facts_deleted")
            elif decision.event == "NONE" and decision.fact_index is not None:
                duplicate = fresh[decision.fact_index].text
                meta["new_text"] = duplicate
                self.writer.history(
                    decision.memory_id, "NONE", old_ref=decision.memory_id, meta=meta
                )
                self._count("facts_unchanged")
        for decision, text, new_id in writes:
            candidate = fresh[decision.fact_index] if decision.fact_index is not None else None
            memory = fact_memory(turn, text, candidate, self.categories)
            meta = {**base, "reason": decision.reason, "similarity": decision.similarity}
            if decision.event == "ADD":
                self.writer.add(memory, memory_id=new_id, meta=meta)
                self._count("facts_added")
            else:
                assert decision.memory_id is not None
                self.writer.replace(decision.memory_id, memory, memory_id=new_id, meta=meta)
                self._count("facts_updated")
            self.written.append(new_id)


def write_turns(
    writer: MemoryWriter,
    turns: Sequence[UserTurn],
    *,
    llm: LLMClient | None = None,
    extracted: Mapping[str, Extracted] | None = None,
    counts: dict[str, int] | None = None,
    gate: ConsentGate | None = None,
    categories: CategoryConfig | None = None,
) -> TurnWriter:
    """Examine user turns in order and write their facts, inside `writer`'s open transaction.

    The live write path's step: each turn's facts are extracted (unless `extracted` holds them
    by `UserTurn.key`: extract before opening the store, so an LLM does not hold DuckDB's lock),
    checked (seed 003 §9), deduplicated and reconciled against the same owner's facts, and
    written with history and change log. Returns the `TurnWriter`: `.written` (new fact ids),
    `.failed` (turns whose extraction failed), `.timings`. `writer` may be a `MemoryWriter` or
    a `live_writer.LiveWriter` (then `gate` is its `LiveConsentGate`). `categories`: the
    categories file as the caller already loaded it (else it is read here).
    """
    if extracted is None:
        extracted = dict(zip((t.key for t in turns), extract_turns(llm, list(turns)), strict=True))
    method = "llm" if llm is not None else "rules"
    counts = counts if counts is not None else {}
    turn_writer = TurnWriter(writer, llm, method, counts, gate, categories)
    # One embedding call for the whole batch instead of one per turn.
    writer.embed([c.text for t in turns for c in extracted[t.key][0]])
    for turn in turns:
        turn_writer.turn(turn, *extracted[turn.key])
    return turn_writer


def fact_memory(
    turn: UserTurn,
    text: str,
    candidate: FactCandidate | None,
    categories: CategoryConfig | None = None,
) -> NewMemory:
    """The fact row for `text` said in `turn` (category and importance from the extractor;
    `categories`: the categories file as already loaded)."""
    if candidate is not None and candidate.text == text:
        category, importance = candidate.category, candidate.importance
    else:
        category, importance = classify_fact(text)
    return NewMemory(
        content=text,
        kind="fact",
        conversation_id=turn.conversation_id,
        session_id=turn.session_id,
        speaker=turn.speaker,
        source_role=turn.role,
        category=known_category(category, categories),
        importance=importance,
        event_time=turn.event_time,
        source_ids=[turn.episode_id],
        user_id=turn.user_id,
        decay_rate=FACT_DECAY_RATE,
    )


@progress.tracked("facts")
def consolidate(
    settings: Settings,
    *,
    include_open: bool = False,
    llm: LLMClient | None = None,
    now: datetime | None = None,
) -> WriteReport:
    """Register new sessions, reopen changed ones, consolidate the closed pending ones and
    observe the new turns of the open ones (`include_open`: close those too). `now` is the
    run's clock (default: the wall clock)."""
    started = time.perf_counter()
    llm = llm if llm is not None else llm_client(settings)
    method = "llm" if llm is not None else "rules"
    report = WriteReport("facts", method=method)
    counts: dict[str, int] = dict.fromkeys(_COUNT_KEYS, 0)
    timings = {"extract_wait": 0.0, "reconcile": 0.0, "write": 0.0, "relations": 0.0}
    provider = get_provider(settings)
    # Live writes first: the turns they examined are then never extracted again (`fold.py`).
    counts["live_calls_folded"] = fold_journal(settings).counts["calls"]

    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, provider, actor=ACTOR, now=now)
        with writer.transaction():
            counts["sessions_registered"] = register_sessions(con, writer.now())
            counts["sessions_reopened"] = len(reopen_changed_sessions(writer))
        sessions = load_sessions(con)
        due = sessions_due(sessions, include_open)
        closing = {session.path for session in due}
        live = [s for s in sessions if s.consolidated_at is None and s.path not in closing]
        order = {session.path: position for position, session in enumerate(sessions)}
        due = sorted([*due, *live], key=lambda s: order[s.path])  # oldest first, as said
        progress.set_total(len(due), "sessions")
        pending = _pending_turns(con, due)

    turns = [turn for session in due for turn in pending[session.path]]
    if llm is None:  # the rules run in worker processes while the first sessions are written
        said = [(t.content, t.speaker, t.turn_id) for t in turns]
        found = process_map_iter(extract_facts_rules_batch, said)
        results = ((candidates, None, rejected) for candidates, rejected in found)
    else:  # an LLM's calls are made before the store is opened
        found, results = None, iter(extract_turns(llm, turns))
    extracted = ArrivingExtractions(turns, results)
    try:
        written = _write_sessions(
            settings, llm, method, due, pending, extracted, counts, timings, closing, now
        )
    finally:
        if found is not None:
            found.close()  # a failed run leaves no extraction behind in the workers
    timings["extract_wait"] = extracted.waited

    with open_store(settings.db_path) as con:
        counts["sessions_open"] = int(
            con.execute(
                "SELECT count(*) FROM sessions_consolidations s JOIN files f ON f.path = s.path "
                "WHERE s.consolidated_at IS NULL"
            ).fetchone()[0]
        )
        counts["facts_active"] = int(con.execute("SELECT count(*) FROM facts").fetchone()[0])
        with listed(con, "_written", written):
            report.preview = fetch_dicts(
                con,
                "SELECT id, conversation_id, speaker, category, importance, content FROM memories "
                "WHERE id IN (SELECT value FROM _written) ORDER BY created_at DESC, id LIMIT ?",
                [PREVIEW_ROWS],
            )
    report.counts = counts
    report.conversations = sorted(
        {s.conversation_id or "" for s in due if s.path in closing or pending[s.path]}
    )
    report.timings = {key: round(value, 3) for key, value in timings.items()}
    if counts["relations"]:
        ms_per_edge = 1000 * timings["relations"] / counts["relations"]
        report.timings["relations_ms_per_edge"] = round(ms_per_edge, 3)
    report.notes.append(_method_note(method, settings))
    if counts["llm_failures"]:
        report.notes.append(
            f"{counts['llm_failures']} LLM failures: see `SELECT * FROM events WHERE status = "
            "'error'`"
        )
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _write_sessions(
    settings: Settings,
    llm: LLMClient | None,
    method: str,
    due: list[Session],
    pending: dict[str, list[UserTurn]],
    extracted: Mapping[str, Extracted],
    counts: dict[str, int],
    timings: dict[str, float],
    closing: set[str],
    now: datetime | None,
) -> list[str]:
    """Reconcile and write the sessions in order; returns the new fact ids. Sessions in
    `closing` are marked consolidated; the others (live) only record the turns examined.

    Sessions are written in batches, one transaction and one connection per batch: a batch
    ends after `LOCK_HOLD_SECONDS`, so the agent's commands can write during long runs, and a
    crash loses at most the current batch, which stays pending (each DuckDB commit costs
    ~10 ms, so one transaction per session would dominate a rules run).
    """
    provider = get_provider(settings)
    written: list[str] = []
    position = 0
    window_turns = FIRST_PREFETCH_TURNS
    while position < len(due):
        with open_store(settings.db_path) as con:
            writer = MemoryWriter(con, provider, actor=ACTOR, now=now)
            opened = time.monotonic()
            with writer.transaction():
                # The categories file once a batch (the writer's, read once a transaction),
                # not twice a session: each read stats the file.
                categories = writer.categories
                gate = ConsentGate(writer, categories.consent)
                prefetched = position  # due[position:prefetched] are looked up already
                marks: list[dict[str, Any]] = []
                while position < len(due) and time.monotonic() - opened < LOCK_HOLD_SECONDS:
                    if position == prefetched:
                        prefetched = _prefetch_window(
                            writer, due, position, pending, extracted, window_turns
                        )
                        window_turns = min(2 * window_turns, PREFETCH_TURNS)
                    session, turns = due[position], pending[due[position].path]
                    position += 1
                    if session.path not in closing and not turns:
                        progress.advance()
                        continue  # a live session with nothing new
                    session_writer = write_turns(
                        writer,
                        turns,
                        llm=llm,
                        extracted=extracted,
                        counts=counts,
                        gate=gate,
                        categories=categories,
                    )
                    closed = session.path in closing
                    marks.append(
                        _mark_session(writer, session, turns, session_writer, method, closed=closed)
                    )
                    counts["sessions_consolidated" if closed else "sessions_observed"] += 1
                    progress.advance()
                    timings["reconcile"] += session_writer.timings["reconcile"]
                    timings["write"] += session_writer.timings["write"]
                    written.extend(session_writer.written)
                _write_marks(writer, marks)
            if position < len(due):
                # The next batch opens the store again at once: closing without a checkpoint
                # leaves the batch in the write-ahead log (committed, replayed in milliseconds
                # on open; DuckDB still checkpoints when the log grows past its threshold),
                # where a checkpoint rewrites the last row group of `memories` (~0.8 s at
                # 100k turns) at every batch. The stage's last close checkpoints as before.
                con.execute("PRAGMA disable_checkpoint_on_shutdown")
        for key in ("entities_created", "entity_links", "relations", "llm_failures"):
            counts[key] += writer.counts.get(key, 0)
        timings["relations"] += writer.relation_seconds
    return written


#: The sessions ahead whose owners' facts and candidates' vectors are looked up at once hold
#: about this many user turns (see `_prefetch_window`). The first window of a run holds
#: `FIRST_PREFETCH_TURNS`, and each next one twice as many up to `PREFETCH_TURNS`: the
#: window's candidates must have arrived from the worker processes, and the first sessions are
#: reconciled as soon as theirs have, while the workers extract the rest.
PREFETCH_TURNS = 20_000
FIRST_PREFETCH_TURNS = 1_000


def _prefetch_window(
    writer: MemoryWriter,
    due: list[Session],
    start: int,
    pending: dict[str, list[UserTurn]],
    extracted: Mapping[str, Extracted],
    window_turns: int,
) -> int:
    """Look up, in one query each, what the sessions from `start` on would look up one by one:
    their owners' facts, their candidates' cached vectors and their conversations' revision
    counters; returns where the window ends.
    The candidates not cached are embedded in one call (~5x less than session by session: the
    embedder's cost is mostly per call for a session's few facts).

    A window, not every remaining session: each batch has a new writer, and looking up all
    that is left at every batch grew with the square of the corpus (a long run has hundreds of
    batches). Owners already loaded in this batch keep their in-memory facts, and an owner is
    loaded before anything of theirs is written in the batch, so the result is the same.
    """
    end, turns = start, 0
    while end < len(due) and (end == start or turns < window_turns):
        turns += len(pending[due[end].path])
        end += 1
    window = [turn for session in due[start:end] for turn in pending[session.path]]
    writer.prefetch_facts(owner_key(t.user_id, t.conversation_id) for t in window)
    writer.load_revisions(session.conversation_id for session in due[start:end])
    writer.embed([c.text for t in window for c in extracted[t.key][0]])
    return end


def _method_note(method: str, settings: Settings) -> str:
    if method == "llm":
        return f"method llm: extraction and reconciliation by {settings.llm_model}"
    return (
        "method rules (no LLM configured): self-statement rules for extraction, "
        "similarity bands and fact structure for reconciliation"
    )


def _mark_session(
    writer: MemoryWriter,
    session: Session,
    turns: list[UserTurn],
    session_writer: TurnWriter,
    method: str,
    *,
    closed: bool,
) -> dict[str, Any]:
    """Record the turns this run examined: a closed session is consolidated (op
    `consolidate`); a live one only `observe`s them, leaving turns whose extraction failed for
    a later run or its close (seed 004's re-check). Returns its `sessions_consolidations`
    mark, written with the batch's others by `_write_marks`."""
    written = len(session_writer.written)
    failed = set() if closed else set(session_writer.failed)
    meta = {"path": session.path, "session_id": session.session_id}
    writer.record_event(
        NODE,
        "consolidate" if closed else "observe",
        "ok",
        conversation_id=session.conversation_id,
        detail=session.path,
        meta={
            **meta,
            **({"file_hash": session.file_hash} if closed else {}),
            "method": method,
            "facts_written": written,
            "turns": [turn.key for turn in turns if turn.key not in failed],
        },
    )
    closed_at = writer.now() if closed else None
    return {"path": session.path, "written": written, "method": method, "at": closed_at}


_MARK_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("written", pa.int32()),
        ("method", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
    ]
)


def _write_marks(writer: MemoryWriter, marks: list[dict[str, Any]]) -> None:
    """Record a batch's sessions in one statement (`at` is None for a live session: it stays
    open)."""
    if not marks:
        return
    con = writer.con
    with registered(con, "_marks", pa.Table.from_pylist(marks, schema=_MARK_SCHEMA)):
        con.execute(
            "UPDATE sessions_consolidations "
            "SET consolidated_at = coalesce(m.at, sessions_consolidations.consolidated_at), "
            "facts_written = coalesce(facts_written, 0) + m.written, method = m.method "
            "FROM _marks m WHERE sessions_consolidations.path = m.path"
        )


# --------------------------------------------------------------------------- entities


@progress.tracked("entities")
def link_pending_entities(
    settings: Settings, kinds: tuple[str, ...] = ("episode", "fact")
) -> StageReport:
    """Entities of every memory not linked yet (new or re-ingested episodes, facts).

    Facts written by `MemoryWriter` are linked when written; this catches episodes, which the
    ingest stage writes. Links of memories that no longer exist are removed, so mention counts
    stay honest when transcripts change or go.
    """
    report = StageReport("entities")
    started = time.perf_counter()
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=ACTOR)
        pending = con.execute(
            "SELECT id, content, conversation_id FROM memories "
            "WHERE kind IN (SELECT unnest(?::TEXT[])) "
            "AND json_extract_string(attributes, '$.entities_at') IS NULL "
            "ORDER BY coalesce(event_time, created_at), id",
            [list(kinds)],
        ).fetchall()
        progress.set_total(len(pending), "memories")
        with writer.transaction():
            orphans = _drop_orphan_links(con)
            writer.link_entities([(row[0], row[1]) for row in pending])
        progress.advance(len(pending))
        totals = con.execute(
            "SELECT (SELECT count(*) FROM entities), (SELECT count(*) FROM memory_entities)"
        ).fetchone()
        report.preview = fetch_dicts(
            con,
            "SELECT canonical_name, type, mention_count, aliases FROM entities "
            "ORDER BY mention_count DESC, canonical_name LIMIT ?",
            [PREVIEW_ROWS],
        )
    report.conversations = sorted({row[2] or "" for row in pending})
    report.counts = {
        "memories_linked": len(pending),
        "entities_created": writer.counts.get("entities_created", 0),
        "entity_links": writer.counts.get("entity_links", 0),
        "orphan_links_removed": orphans,
        "entities": int(totals[0]),
        "links": int(totals[1]),
    }
    report.notes.append("extractor: fast (regex + capitalised-name heuristics)")
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _drop_orphan_links(con: Any) -> int:
    con.execute(
        "UPDATE entities SET mention_count = entities.mention_count - gone.n "
        "FROM (SELECT entity_id, count(*) AS n FROM memory_entities "
        "      WHERE memory_id NOT IN (SELECT id FROM memories) GROUP BY entity_id) gone "
        "WHERE entities.id = gone.entity_id"
    )
    row = con.execute(
        "DELETE FROM memory_entities WHERE memory_id NOT IN (SELECT id FROM memories)"
    ).fetchone()
    return int(row[0]) if row else 0
