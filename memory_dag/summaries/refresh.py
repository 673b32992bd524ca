"""Bringing many conversations' summaries up to date in one pass: which are due, and the
summaries themselves, read, summarized and written a group of conversations at a time.

An ingest run asks for the conversations whose files changed (`conversations_due`, before the
run, from the filesystem and the store); `summarize_conversations` gathers each group's input
with one query per table, skips conversations whose input has not changed since their
summary, runs the extractive summarizer of many conversations in worker processes (an LLM's
calls stay in this process), and writes the group's trees and events in one transaction; the
workers summarize a group while this process reads the next and writes the one before. The
rows themselves (ids, tree layout, retiring old trees) are `conversation_summaries.py`'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.parallel import InOrder, process_map_iter
from memory_dag.reports import PREVIEW_ROWS, StageReport
from memory_dag.store.connection import listed, open_store
from memory_dag.summaries.conversation_summaries import (
    CONTENT_TYPE,
    ConversationInput,
    Event,
    StoredSummary,
    SummaryRun,
    conversation_ids,
    final_id,
    gather_inputs,
    record_events,
    summarizer_identity,
    write_summaries,
)
from memory_dag.summaries.line_tokens import Counted
from memory_dag.summaries.summarizer import (
    SummarizationError,
    SummarizerConfig,
    SummaryResult,
    summarize,
)


def conversations_due(settings: Settings) -> list[str]:
    """The conversations an ingest run must bring up to date, before it runs: those with files
    new, changed or deleted on disk since the store read them, and those whose files or facts
    changed after their last summarization (a run that stopped before its summaries)."""
    from memory_dag.summaries.due import workspace_due

    return workspace_due(settings)[0]


def summarize_due(
    settings: Settings, conversations: Sequence[str] | None = None, *, force: bool = False
) -> StageReport:
    """`summarize_conversations` as a pipeline stage: what it did, as a `StageReport`."""
    started = time.perf_counter()
    runs = summarize_conversations(settings, conversations, force=force)
    return summary_report(runs, time.perf_counter() - started)


def summary_report(runs: list[SummaryRun], seconds: float) -> StageReport:
    """Counts of a stage's summaries, and the conversations it summarized again."""
    statuses = [run.status for run in runs]
    changed = [run for run in runs if run.status != "unchanged"]
    return StageReport(
        "summaries",
        counts={
            "conversations": len(runs),
            "summarized": statuses.count("written"),
            "unchanged": statuses.count("unchanged"),
            "too_short": statuses.count("none"),
        },
        seconds=round(seconds, 3),
        preview=[
            {
                "conversation": run.conversation_id,
                "status": run.status,
                "level": run.level.value,
                "input_tokens": run.input_tokens,
                "output_tokens": run.output_tokens,
                "ratio": round(run.compression_ratio, 4),
            }
            for run in changed[:PREVIEW_ROWS]
        ],
        conversations=[run.conversation_id for run in changed],
    )


#: Conversations are read, summarized and written in groups of about this many turns: one
#: connection reads a group and one transaction writes it, and memory stays bounded (two groups
#: are held at once: one being written, the next being summarized). Each group costs ~0.1 s of
#: queries more; at 100k turns, two groups hide half of the reading and writing behind the
#: workers' summaries.
GROUP_TURNS = 50_000


def summarize_conversation(
    settings: Settings,
    conversation_id: str,
    *,
    config: SummarizerConfig | None = None,
    force: bool = False,
) -> SummaryRun:
    """Bring one conversation's summary up to date; skipped when its input has not changed.

    Raises `SummarizationError` when the summarizer fails: the failure is recorded in `events`
    and the previous summary stays active.
    """
    [run] = summarize_conversations(settings, [conversation_id], config=config, force=force)
    return run


@progress.tracked("summaries")
def summarize_conversations(
    settings: Settings,
    conversations: Sequence[str] | None = None,
    *,
    config: SummarizerConfig | None = None,
    force: bool = False,
) -> list[SummaryRun]:
    """Bring these conversations' summaries up to date (every conversation when None).

    A conversation whose input has not changed since its summary is skipped. Each group of
    conversations (`GROUP_TURNS`) is read on one connection and written in one transaction, and
    no connection is held while the summarizer runs (it may call an LLM for minutes). A
    conversation whose summarizer or write fails keeps its previous summary (the failure is in
    `events`); the others are written, then the failure is raised.

    Extractive summaries are made by the worker processes while this process reads the next
    group and writes the one before: a group is submitted as soon as it is read.
    """
    config = config or SummarizerConfig.from_settings(settings)
    identity = summarizer_identity(config)
    if conversations is None:
        conversations = conversation_ids(settings)
    runs: list[SummaryRun] = []
    failures: list[tuple[str, BaseException]] = []
    conversations = list(conversations)
    progress.set_total(len(conversations), "conversations")
    in_flight: list[_Group] = []  # at most two: one written while the next is summarized
    try:
        for group in _groups(settings, conversations):
            in_flight.append(_start_group(settings, group, identity, config, force))
            if len(in_flight) == 2:
                _finish_group(settings, in_flight.pop(0), config, runs, failures)
        if in_flight:
            _finish_group(settings, in_flight.pop(0), config, runs, failures)
    finally:
        for unfinished in in_flight:  # a failed stage leaves no summaries behind in the workers
            if unfinished.extractive is not None:
                unfinished.extractive.close()
    if len(failures) == 1:
        raise failures[0][1]
    if failures:
        raise SummarizationError(
            f"{len(failures)} conversations failed: "
            + "; ".join(f"{conversation}: {error}" for conversation, error in failures[:5])
        )
    return runs


#: Extractive summaries of at least this many conversations are shared by worker processes.
PARALLEL_MIN_CONVERSATIONS = 8

Summarized = tuple[ConversationInput, SummaryResult, float]


@dataclass
class _Group:
    """A group of conversations read from the store, its summaries on their way."""

    gather_seconds: float
    unchanged: list[SummaryRun] = field(default_factory=list)
    due: list[ConversationInput] = field(default_factory=list)
    #: The extractive summaries of `due` (and their seconds), as the workers make them.
    extractive: InOrder[tuple[SummaryResult, float]] | None = None


def _start_group(
    settings: Settings,
    group: list[str],
    identity: str,
    config: SummarizerConfig,
    force: bool,
) -> _Group:
    """Read a group's input; its extractive summaries start in the worker processes."""
    started = time.perf_counter()
    with open_store(settings.db_path) as con:
        gathered = gather_inputs(con, group, identity)
    work = _Group(gather_seconds=round((time.perf_counter() - started) / len(group), 3))
    for item in gathered:
        prior = item.prior
        if not force and prior is not None and prior.source_fingerprint == item.fingerprint:
            work.unchanged.append(_unchanged(item, prior, {"gather": work.gather_seconds}))
            progress.advance()
        else:
            work.due.append(item)
    if config.llm is None:  # sentence extraction: CPU work, shared by worker processes
        shape = config.model_dump(include={"chunk_size", "chunk_overlap", "group_size"})
        jobs = [
            (item.content, item.prior.content if item.prior else None, shape, item.counted)
            for item in work.due
        ]
        work.extractive = process_map_iter(_extractive, jobs, min_items=PARALLEL_MIN_CONVERSATIONS)
    return work


def _finish_group(
    settings: Settings,
    work: _Group,
    config: SummarizerConfig,
    runs: list[SummaryRun],
    failures: list[tuple[str, BaseException]],
) -> None:
    """Take a group's summaries (an LLM's are made now) and write them; adds to `runs` and
    `failures`."""
    runs += work.unchanged
    summarized: list[Summarized] = []
    errors: list[tuple[ConversationInput, SummarizationError]] = []
    if work.extractive is not None:
        for item, (result, seconds) in zip(work.due, work.extractive, strict=True):
            summarized.append((item, result, seconds))
    else:
        for item in work.due:
            started = time.perf_counter()
            try:
                prior = item.prior.content if item.prior else None
                result = summarize(item.content, config, prior, CONTENT_TYPE, counted=item.counted)
            except SummarizationError as error:
                errors.append((item, error))
                continue
            summarized.append((item, result, round(time.perf_counter() - started, 3)))
    if not summarized and not errors:
        return
    started = time.perf_counter()
    with open_store(settings.db_path) as con:
        written, write_failures = _write_group(con, summarized, errors)
    write_seconds = round((time.perf_counter() - started) / (len(summarized) + len(errors)), 3)
    failures += [(item.conversation_id, error) for item, error in errors]
    failures += list(write_failures.items())
    for item, result, seconds in summarized:
        if item.conversation_id in written:
            generation, retired = written[item.conversation_id]
            timings = {"gather": work.gather_seconds, "summarize": seconds, "write": write_seconds}
            runs.append(_run_of(item, result, generation, retired, timings))
    progress.advance(len(summarized) + len(errors))


def _extractive(
    jobs: Sequence[tuple[str, str | None, dict[str, int], Sequence[Counted]]],
) -> list[tuple[SummaryResult, float]]:
    """Extractive summaries of (content, prior summary, chunk and group sizes, turns counted
    already), with the seconds each took."""
    results = []
    for content, prior, shape, counted in jobs:
        started = time.perf_counter()
        config = SummarizerConfig(**shape)
        result = summarize(content, config, prior, CONTENT_TYPE, counted=counted)
        results.append((result, round(time.perf_counter() - started, 3)))
    return results


def _groups(settings: Settings, conversation_ids: list[str]) -> list[list[str]]:
    """The conversations in groups of about `GROUP_TURNS` turns, in the order given."""
    if len(conversation_ids) <= 1:
        return [conversation_ids] if conversation_ids else []
    with (
        open_store(settings.db_path, read_only=True) as con,
        listed(con, "_conversations", conversation_ids),
    ):
        turns = dict(
            con.execute(
                "SELECT conversation_id, count(*) FROM episodes "
                "WHERE conversation_id IN (SELECT value FROM _conversations) GROUP BY 1"
            ).fetchall()
        )
    groups: list[list[str]] = [[]]
    size = 0
    for conversation_id in conversation_ids:
        if groups[-1] and size + turns.get(conversation_id, 0) > GROUP_TURNS:
            groups.append([])
            size = 0
        groups[-1].append(conversation_id)
        size += turns.get(conversation_id, 0)
    return groups


def _run_of(
    gathered: ConversationInput,
    result: SummaryResult,
    generation: int | None,
    retired: int,
    seconds: dict[str, float],
) -> SummaryRun:
    tree = result.hierarchical
    return SummaryRun(
        conversation_id=gathered.conversation_id,
        status="written" if generation is not None else "none",
        level=result.level,
        method=result.method,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        compression_ratio=result.compression_ratio,
        turns=gathered.turns,
        sessions=gathered.sessions,
        facts=gathered.facts,
        l1=len(tree.l1_summaries) if tree else 0,
        l2=len(tree.l2_summaries) if tree else 0,
        generation=generation,
        retired=retired,
        final_id=final_id(gathered.conversation_id) if generation is not None else None,
        preview=result.summary or "",
        seconds=seconds,
    )


def _unchanged(
    gathered: ConversationInput, prior: StoredSummary, seconds: dict[str, float]
) -> SummaryRun:
    return SummaryRun(
        conversation_id=gathered.conversation_id,
        status="unchanged",
        level=prior.summary_level,
        method=prior.method or "",
        input_tokens=prior.input_tokens or 0,
        output_tokens=prior.output_tokens or 0,
        compression_ratio=prior.compression_ratio or 0.0,
        turns=gathered.turns,
        sessions=gathered.sessions,
        facts=gathered.facts,
        generation=prior.generation,
        final_id=prior.id,
        preview=prior.content,
        seconds=seconds,
    )


def _write_group(
    con: duckdb.DuckDBPyConnection,
    summarized: list[Summarized],
    errors: list[tuple[ConversationInput, SummarizationError]],
) -> tuple[dict[str, tuple[int | None, int]], dict[str, BaseException]]:
    """Write a group's new trees and events in one transaction or, when that fails, one
    transaction per conversation, so a bad tree keeps only itself out.

    Returns ((generation, rows retired) per written conversation, the error per failed one).
    """
    try:
        return _write_trees_and_events(con, summarized, errors), {}
    except duckdb.Error:
        if len(summarized) <= 1:
            raise
    written: dict[str, tuple[int | None, int]] = {}
    failed: dict[str, BaseException] = {}
    for one in summarized:
        try:
            written.update(_write_trees_and_events(con, [one], []))
        except duckdb.Error as error:
            failed[one[0].conversation_id] = error
    _write_trees_and_events(con, [], errors)
    return written, failed


def _write_trees_and_events(
    con: duckdb.DuckDBPyConnection,
    summarized: list[Summarized],
    errors: list[tuple[ConversationInput, SummarizationError]],
) -> dict[str, tuple[int | None, int]]:
    con.execute("BEGIN TRANSACTION")
    try:
        written = write_summaries(con, [(item, result) for item, result, _ in summarized])
        events: list[Event] = []
        for item, result, _ in summarized:
            generation, retired = written[item.conversation_id]
            detail = f"{result.level.value}: {result.input_tokens} -> {result.output_tokens} tokens"
            meta = {
                "level": result.level.value,
                "input_tokens": result.input_tokens,
                "output_tokens": result.output_tokens,
                "compression_ratio": result.compression_ratio,
                "method": result.method,
                "generation": generation,
                "retired": retired,
            }
            memory_id = final_id(item.conversation_id) if generation is not None else None
            events.append(Event(item.conversation_id, "ok", detail, meta, memory_id))
        for item, error in errors:
            events.append(Event(item.conversation_id, "error", str(error), {"turns": item.turns}))
        record_events(con, events)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return written
