"""Adaptive summarizer (seed 001): summary depth scales with the token count of the input.

    < 100 tokens  NONE          nothing to summarize
    < 500         BRIEF         one sentence          (~20%)
    < 3000        STANDARD      one paragraph         (~12%)
    < 15000       DETAILED      L1 per chunk + meta   (~7%)
    otherwise     HIERARCHICAL  L1 / L2 / L3 tree     (~3-5%)

With an LLM every node is an LLM call (L1 and L2 calls in parallel, bounded). Without one, an
extractive summarizer (TF-IDF centrality with a redundancy penalty, numpy only) selects
sentences under the same per-level token budgets and builds the same tree, so levels, tree
shape and compression metrics stay real when the pipeline runs offline. Errors fail fast
(seed §8): an LLM failure raises SummarizationError, never a partial tree.

Kept as one module (~900 lines): seed 001's summarizer is one algorithm; level choice,
chunking, middle truncation and the LLM and extractive engines share its budgets and units.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Literal, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from threadpoolctl import threadpool_limits

from memory_dag.config import Settings
from memory_dag.ingest.tokens import (
    CHARS_PER_TOKEN,
    CL100K_PATTERN,
    count_tokens,
    count_tokens_batch,
    count_tokens_cached,
    get_encoding,
)
from memory_dag.ingest.tokens import split_by_tokens as _split_by_tokens
from memory_dag.llm import LLMClient, LLMConfig, LLMError
from memory_dag.summaries import prompts
from memory_dag.summaries.line_tokens import Counted, LineTokens

THRESHOLD_NONE = 100
THRESHOLD_BRIEF = 500
THRESHOLD_STANDARD = 3000
THRESHOLD_DETAILED = 15000

#: Target output/input token ratios (seed 001 §3.1). They size the extractive selection and
#: cap LLM answers (`max_tokens` is twice the target, so a model is guided, not truncated).
BRIEF_RATIO = 0.20
STANDARD_RATIO = 0.12
CHUNK_RATIO = 0.07  # each L1 summary, of its chunk
DETAILED_META_RATIO = 0.07  # the DETAILED synthesis, of the whole input
GROUP_RATIO = 0.05  # each L2 summary, of the source tokens its L1s cover
FINAL_RATIO = 0.04  # the HIERARCHICAL L3, of the whole input
MIN_MAX_TOKENS = 256

#: Tokens kept free in a chunk for separators and re-tokenization at the joins.
_JOIN_MARGIN = 8

_PARAGRAPH_SPLIT = re.compile(r"(\r?\n[ \t\r]*\n\s*)")
_SENTENCE_SPLIT = re.compile(r"((?<=[.!?])\s+|(?<=[.!?][\"'”’)\]])\s+|\s*\n\s*)")
#: `_SENTENCE_SPLIT` within one line (no line break): the same cuts, found ~3x faster, since
#: a pattern that starts with `\s` lets the regex engine skip to the next whitespace.
_LINE_SENTENCE_SPLIT = re.compile(r"(\s(?:(?<=[.!?]\s)|(?<=[.!?][\"'”’)\]]\s))\s*)")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
#: Each byte of lower-cased text encoded as ASCII: kept when `_WORD` can hold it or it is a
#: line break, else a space (a character outside ASCII is a "?" once encoded).
_WORD_BYTES = bytes(
    byte if chr(byte) in "abcdefghijklmnopqrstuvwxyz0123456789'\n" else ord(" ")
    for byte in range(256)
)
_STOPWORD_TEXT = """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves also yes ok okay oh well really like get got s t"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
#: `Name:` / `Two Names:` at the start of a line: a transcript's speaker label.
_SPEAKER_LABEL = re.compile(r"^([A-Z][\w'-]*(?: [A-Z][\w'-]*){0,2}):", re.MULTILINE)
#: Sentences with fewer content words are pleasantries ("Thanks, Gina!"), not summary material.
MIN_CONTENT_WORDS = 5
#: Structure, never summary material: `[session, date]` headers and lines ending in ":" (such
#: as "Facts noted since the last summary:").
_STRUCTURE_LINE = re.compile(r"^\[[^\]]*\]$|:$")
#: A sentence starting with one of these points back to the one before it ("This replaces the
#: earlier statement ..."): the two are chosen together or not at all.
_ANAPHOR_START = re.compile(
    r"^(?:[A-Z][\w'-]*(?: [A-Z][\w'-]*){0,2}:\s*)?"
    r"(?:this|that|these|those|it|its|it's|he|she|they|him|her|his|hers|them|their|theirs)\b",
    re.IGNORECASE,
)
#: What `_ANAPHOR_START`'s pronouns can start with, ignoring case (Python also folds the
#: dotted and dotless i and the long s into i and s).
_ANAPHOR_INITIALS = frozenset("tihsTIHS\u0130\u0131\u017f")
_LIST_MARKER = re.compile(r"^[-*•]\s+")
#: Starts the line of a turn whose statement a newer one superseded: history, never quoted by
#: the extractive summarizer as if it still held (an LLM is told what the mark means).
SUPERSEDED_MARK = "[superseded] "
#: How strongly the extractive selection avoids sentences similar to ones already chosen.
_REDUNDANCY_PENALTY = 0.5
#: Sentence → token count, for `sentence_tokens` (at most this many kept).
_SENTENCE_TOKENS: dict[str, int] = {}
_SENTENCE_TOKENS_MAX = 200_000

T = TypeVar("T")
R = TypeVar("R")


class SummaryLevel(StrEnum):
    """How deep to summarize; the value is the name stored in summary metadata."""

    NONE = "NONE"
    BRIEF = "BRIEF"
    STANDARD = "STANDARD"
    DETAILED = "DETAILED"
    HIERARCHICAL = "HIERARCHICAL"


class ChunkSummary(BaseModel):
    """An L1 node: the summary of one chunk of the input."""

    chunk_index: int
    content: str
    token_count: int
    source_tokens: int
    parent_group: int | None = None


class HierarchicalSummary(BaseModel):
    """The summary tree for DETAILED (L1 + L3) and HIERARCHICAL (L1 + L2 + L3) inputs."""

    l1_summaries: list[ChunkSummary]
    l2_summaries: list[str]
    l3_summary: str
    chunk_size: int = 3000
    chunk_overlap: int = 200
    #: The input's chunks, in order (what provenance maps sources onto; not serialised).
    chunks: list[str] = Field(default_factory=list, exclude=True)
    #: The token count of each L2 summary, counted where the tree was built (a worker process),
    #: not again where it is written (not serialised).
    l2_tokens: list[int] = Field(default_factory=list, exclude=True)


class SummaryResult(BaseModel):
    """A summary with its compression metrics; `summary` is the final text at every level."""

    level: SummaryLevel
    summary: str | None
    hierarchical: HierarchicalSummary | None = None
    input_tokens: int
    output_tokens: int
    compression_ratio: float = Field(ge=0.0, le=1.0)
    method: Literal["llm", "extractive"]


class SummarizerConfig(BaseModel):
    """How to summarize: with `llm` set every node is an LLM call, else extractive."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: LLMClient | None = None
    chunk_size: int = 3000
    chunk_overlap: int = 200
    group_size: int = 5
    max_concurrency: int = 4

    @classmethod
    def from_settings(cls, settings: Settings) -> SummarizerConfig:
        """LLM summaries when the settings configure an LLM, extractive ones otherwise."""
        llm_config = LLMConfig.from_settings(settings)
        return cls(llm=LLMClient(llm_config) if llm_config else None)


class SummarizationError(RuntimeError):
    """The summary could not be built; nothing partial is returned."""


def determine_level(tokens: int) -> SummaryLevel:
    """The summary level for an input of `tokens` tokens (seed 001 §4.2)."""
    if tokens < THRESHOLD_NONE:
        return SummaryLevel.NONE
    if tokens < THRESHOLD_BRIEF:
        return SummaryLevel.BRIEF
    if tokens < THRESHOLD_STANDARD:
        return SummaryLevel.STANDARD
    if tokens < THRESHOLD_DETAILED:
        return SummaryLevel.DETAILED
    return SummaryLevel.HIERARCHICAL


def summarize(
    content: str,
    config: SummarizerConfig,
    prior_summary: str | None = None,
    content_type: str = "general",
    *,
    counted: Sequence[Counted] = (),
) -> SummaryResult:
    """Summarize `content` at the level its token count calls for.

    `prior_summary` (the previous final summary) is context for the last step: the rolling
    prompt for BRIEF, `{prior_context}` of the paragraph prompt for STANDARD, and of the
    final synthesis for DETAILED and HIERARCHICAL. `counted`: (start, end, tokens) of
    stretches of `content` whose token counts are known (a conversation's turns, counted when
    they were chunked), not encoded again.
    """
    if config.llm is None:
        # Sentence extraction multiplies many small matrices: BLAS threads only add waiting.
        with threadpool_limits(1, user_api="blas"):
            engine: _Engine = _ExtractiveEngine()
            return _summarize(content, engine, config, prior_summary, content_type, counted)
    return _summarize(content, _LLMEngine(config), config, prior_summary, content_type, counted)


def _summarize(
    content: str,
    engine: _Engine,
    config: SummarizerConfig,
    prior_summary: str | None,
    content_type: str,
    counted: Sequence[Counted] = (),
) -> SummaryResult:
    if not content.strip():
        return _result(SummaryLevel.NONE, None, None, 0, engine.method)
    lines = LineTokens.of(content, counted)  # counts the input once, for its chunks too
    input_tokens = lines.total() if lines is not None else count_tokens(content)
    level = determine_level(input_tokens)
    prior = prior_summary if prior_summary and prior_summary.strip() else None

    if level is SummaryLevel.NONE:
        return _result(level, None, None, input_tokens, engine.method)
    if level is SummaryLevel.BRIEF:
        summary = engine.brief(content, prior, _budget(BRIEF_RATIO, input_tokens))
        return _result(level, summary, None, input_tokens, engine.method)
    if level is SummaryLevel.STANDARD:
        budget = _budget(STANDARD_RATIO, input_tokens)
        summary = engine.standard(content, prior, content_type, budget)
        return _result(level, summary, None, input_tokens, engine.method)

    chunks, known = _chunks_counted(
        content, config.chunk_size, config.chunk_overlap, tokens=input_tokens, lines=lines
    )
    # Chunking counted most chunks already: only the others are encoded again.
    unknown = [i for i, count in enumerate(known) if count is None]
    counted = dict(zip(unknown, count_tokens_batch([chunks[i] for i in unknown]), strict=True))
    chunk_tokens = [count if count is not None else counted[i] for i, count in enumerate(known)]

    def summarize_chunk(index: int) -> str:
        budget = _budget(CHUNK_RATIO, chunk_tokens[index])
        return engine.chunk(chunks[index], index, len(chunks), budget)

    engine.prepare(chunks)
    l1_texts = engine.map(summarize_chunk, range(len(chunks)), config.max_concurrency)
    l1 = [
        ChunkSummary(
            chunk_index=i,
            content=text,
            token_count=count_tokens(text),
            source_tokens=chunk_tokens[i],
        )
        for i, text in enumerate(l1_texts)
    ]

    l2_texts: list[str] = []
    if level is SummaryLevel.DETAILED:
        budget = _budget(DETAILED_META_RATIO, input_tokens)
        final = engine.synthesize([s.content for s in l1], prior, budget)
    else:
        size = max(1, config.group_size)
        groups = [l1[start : start + size] for start in range(0, len(l1), size)]
        for group_index, group in enumerate(groups):
            for node in group:
                node.parent_group = group_index

        def summarize_group(group: list[ChunkSummary]) -> str:
            budget = _budget(GROUP_RATIO, sum(node.source_tokens for node in group))
            return engine.synthesize([node.content for node in group], None, budget)

        l2_texts = engine.map(summarize_group, groups, config.max_concurrency)
        final = engine.synthesize(l2_texts, prior, _budget(FINAL_RATIO, input_tokens))

    tree = HierarchicalSummary(
        l1_summaries=l1,
        l2_summaries=l2_texts,
        l2_tokens=[count_tokens(text) for text in l2_texts],
        l3_summary=final,
        chunk_size=config.chunk_size,
        chunk_overlap=config.chunk_overlap,
        chunks=chunks,
    )
    return _result(level, final, tree, input_tokens, engine.method)


def final_summary_text(result: SummaryResult) -> str | None:
    """The text to inject into prompts: the L3 of a tree, else the single summary."""
    if result.hierarchical is not None:
        return result.hierarchical.l3_summary
    return result.summary


# --- Chunking and truncation ---------------------------------------------------------------------


def chunk_text(
    text: str, chunk_size: int = 3000, overlap: int = 200, *, tokens: int | None = None
) -> list[str]:
    """Split text into chunks of at most `chunk_size` tokens on paragraph boundaries.

    Paragraphs too long for a chunk are split into sentences, and sentences too long into
    token-sized character runs (code, tables). Every chunk after the first starts with the last
    `overlap` tokens of the previous chunk, so a fact cut by a boundary is whole in one chunk.
    `tokens` is the text's token count when the caller knows it already.
    """
    return _chunks_counted(text, chunk_size, overlap, tokens=tokens)[0]


def _chunks_counted(
    text: str,
    chunk_size: int,
    overlap: int,
    *,
    tokens: int | None = None,
    lines: LineTokens | None = None,
) -> tuple[list[str], list[int | None]]:
    """`chunk_text`'s chunks and the token count of each that it counted (None: not counted).

    `lines` are the text's line tokens when the caller has them: paragraphs and chunks are then
    counted from them, not encoded again."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    if not 0 <= overlap < chunk_size:
        raise ValueError("overlap must be at least 0 and smaller than chunk_size")
    if not text.strip():
        return [], []
    if lines is None:
        lines = LineTokens.of(text)
    if tokens is None:
        tokens = lines.total() if lines is not None else count_tokens(text)
    if tokens <= chunk_size:
        return [text], [tokens]

    unit_limit = max(1, chunk_size - overlap - _JOIN_MARGIN)
    units, piece_tokens = _split_units(text, unit_limit, lines)
    costs = _unit_costs(units, piece_tokens)
    # Where each unit starts in `text`, and the end; stretches of `text` only when the units
    # join into it (whitespace-only runs longer than a chunk are dropped).
    offsets = list(itertools.accumulate((len(sep) + len(piece) for sep, piece in units), initial=0))
    if "".join(sep + piece for sep, piece in units) != text:
        lines = None

    def count_and_ids(prefix: str, first: int, end: int) -> tuple[int, list[int] | None]:
        """Count `prefix` + units[first:end] and keep its tokens, or at least its last
        `overlap` ones (the next chunk's prefix): from `lines` when a clean cut follows the
        prefix, which then is all that is encoded, with the lines of those last tokens."""
        start, stop = offsets[first], offsets[end]
        if lines is not None:
            cut = start if not prefix and lines.is_cut(start) else lines.next_cut(start)
            if cut <= stop:
                head = (_count_and_ids(prefix + text[start:cut])[1] or []) if cut > start else []
                count, last = lines.count_and_last_ids(cut, stop, overlap)
                if len(last) < overlap:  # the lines hold fewer: the head's tokens come first
                    last = _last_tokens([*head, *last], overlap)
                return len(head) + count, last
        return _count_and_ids(prefix + "".join(sep + piece for sep, piece in units[first:end]))

    chunks: list[str] = []
    counts: list[int | None] = []
    bounds: list[tuple[str, int, int]] = []  # each chunk's prefix and units
    #: the tokens of chunks[-1] (or its last `overlap` ones), when they were counted
    last_ids: list[int] | None = None
    start = 0
    while start < len(units):
        if chunks and last_ids is None:  # its tail needs its tokens: count it with them
            counts[-1], last_ids = count_and_ids(*bounds[-1])
        prefix = _token_tail(chunks[-1], overlap, last_ids, counts[-1]) if chunks else ""
        estimate = count_tokens(prefix)
        end = start
        while end < len(units) and (end == start or estimate + costs[end] <= chunk_size):
            estimate += costs[end]
            end += 1
        # The estimate adds per-unit counts; the joined text can tokenize a little differently.
        count: int | None = None
        last_ids = None
        while end - start > 1:
            count, last_ids = count_and_ids(prefix, start, end)
            if count <= chunk_size:
                break
            end -= 1
            count, last_ids = None, None
        chunks.append(prefix + "".join(sep + piece for sep, piece in units[start:end]))
        counts.append(count)
        bounds.append((prefix, start, end))
        start = end
    return chunks, counts


def _count_and_ids(text: str) -> tuple[int, list[int] | None]:
    """The token count of `text` and, when an encoding is loaded, its tokens (kept for reuse)."""
    encoding = get_encoding()
    if encoding is None:
        return count_tokens(text), None
    ids = encoding.encode_ordinary(text)
    return len(ids), ids


def middle_truncate(
    text: str,
    budget_chars: int,
    head_frac: float = 0.3,
    tail_frac: float = 0.3,
) -> tuple[str, int]:
    """Keep the head and the tail of `text`, drop the middle; returns (text, chars removed).

    Key points cluster at the start and the end (seed 001 §4.5). The result, marker included,
    is at most `budget_chars` long.
    """
    if budget_chars < 0:
        raise ValueError("budget_chars must not be negative")
    if head_frac < 0 or tail_frac < 0 or head_frac + tail_frac > 1:
        raise ValueError("head_frac and tail_frac must be non-negative and sum to at most 1")
    if len(text) <= budget_chars:
        return text, 0
    head_len = int(budget_chars * head_frac)
    tail_len = int(budget_chars * tail_frac)
    marker = _truncation_marker(len(text) - head_len - tail_len)
    overflow = head_len + len(marker) + tail_len - budget_chars
    if overflow > 0:
        # Small budgets: give the marker room by shrinking head and tail in proportion.
        kept = max(0, head_len + tail_len - overflow)
        share = head_frac / (head_frac + tail_frac) if head_frac + tail_frac else 0.5
        head_len = int(kept * share)
        tail_len = kept - head_len
        marker = _truncation_marker(len(text) - head_len - tail_len)
        if head_len + len(marker) + tail_len > budget_chars:
            return text[:budget_chars], len(text) - budget_chars  # no room even for a marker
    removed = len(text) - head_len - tail_len
    tail = text[len(text) - tail_len :] if tail_len else ""
    return text[:head_len] + marker + tail, removed


def _truncation_marker(removed: int) -> str:
    return f"\n[... {removed} characters truncated ...]\n"


def _split_units(
    text: str, limit: int, lines: LineTokens | None = None
) -> tuple[list[tuple[str, str]], list[int | None]]:
    """(separator, piece) pairs whose concatenation is `text`, each piece ≤ `limit` tokens,
    and the token count of each piece that was counted whole (None: not counted). A paragraph
    that starts at a clean cut of `lines` is counted from them."""
    units: list[tuple[str, str]] = []
    counts: list[int | None] = []
    pending_sep = ""
    position = 0
    for index, part in enumerate(_PARAGRAPH_SPLIT.split(text)):
        position += len(part)
        if index % 2 == 1 or not part:
            pending_sep += part
            continue
        start = position - len(part)
        if lines is not None and lines.is_cut(start):
            tokens = lines.count(start, position)
        else:
            tokens = count_tokens(part)
        pieces = [("", part)] if tokens <= limit else _split_paragraph(part, limit)
        for n, (sep, piece) in enumerate(pieces):
            units.append((pending_sep + sep if n == 0 else sep, piece))
            counts.append(tokens if tokens <= limit else None)
            pending_sep = ""
    if pending_sep and units:
        sep, piece = units[-1]
        units[-1] = (sep, piece + pending_sep)
        counts[-1] = None
    return units, counts


def _unit_costs(units: list[tuple[str, str]], piece_tokens: list[int | None]) -> list[int]:
    """Token counts of each `separator + piece`, without encoding a piece counted already.

    cl100k's pre-tokenizer never lets a piece of text run across the end of a separator of
    whitespace that ends in a line break into a piece that starts with anything but
    whitespace: it cuts the two joined as it cuts them apart, so the count is the sum
    (`tests/summaries` compares with whole counts). Other joins are encoded whole.
    """
    encoding = get_encoding()
    exact = encoding is not None and getattr(encoding, "_pat_str", None) == CL100K_PATTERN
    known: dict[int, int] = {}
    for i, ((sep, piece), tokens) in enumerate(zip(units, piece_tokens, strict=True)):
        if exact and tokens is not None and piece[:1].strip() and _joins_cleanly(sep):
            known[i] = count_tokens_cached(sep) + tokens
    unknown = [i for i in range(len(units)) if i not in known]
    known.update(
        zip(unknown, count_tokens_batch(["".join(units[i]) for i in unknown]), strict=True)
    )
    return [known[i] for i in range(len(units))]


def _joins_cleanly(sep: str) -> bool:
    """No separator, or whitespace ending in a line break (see `_unit_costs`)."""
    return not sep or (not sep.strip() and sep.endswith("\n"))


def _split_paragraph(paragraph: str, limit: int) -> list[tuple[str, str]]:
    """A paragraph over `limit` tokens as (separator, piece) pairs of sentences and runs."""
    pieces: list[tuple[str, str]] = []
    sep = ""
    for index, part in enumerate(_SENTENCE_SPLIT.split(paragraph)):
        if index % 2 == 1 or not part:
            sep += part
            continue
        if count_tokens(part) <= limit:
            pieces.append((sep, part))
        else:
            runs = _split_by_tokens(part, limit)
            pieces.append((sep, runs[0]))
            pieces.extend(("", run) for run in runs[1:])
        sep = ""
    if sep and pieces:
        last_sep, last = pieces[-1]
        pieces[-1] = (last_sep, last + sep)
    return pieces


def _token_tail(
    text: str, tokens: int, ids: list[int] | None = None, count: int | None = None
) -> str:
    """The last `tokens` tokens of `text`, cut on a character boundary. `ids`, when known, are
    the text's tokens or at least its last `tokens` ones, of `count` in all."""
    if tokens <= 0:
        return ""
    encoding = get_encoding()
    if encoding is None:
        return text[-tokens * CHARS_PER_TOKEN :]
    if ids is None or count is None:
        ids = encoding.encode_ordinary(text)
        count = len(ids)
    if count <= tokens:
        return text
    # The tail tokens' bytes are the text from where the first of them starts, unless that
    # token begins inside a multi-byte character: only then are the offsets worth computing
    # (from all the text's tokens: the character's first bytes are in the token before).
    try:
        return encoding.decode_bytes(ids[len(ids) - tokens :]).decode("utf-8")
    except UnicodeDecodeError:
        ids = encoding.encode_ordinary(text)
        decoded, offsets = encoding.decode_with_offsets(ids)
        return decoded[offsets[len(ids) - tokens] :]


def _last_tokens(ids: list[int], tokens: int) -> list[int]:
    """The last `tokens` of `ids` (none for 0, where `ids[-0:]` would be all)."""
    return ids[max(0, len(ids) - tokens) :] if tokens > 0 else []


# --- Engines: the same tree, built by an LLM or by sentence extraction ----------------------------


class _Engine(Protocol):
    method: Literal["llm", "extractive"]

    def brief(self, content: str, prior: str | None, budget: int) -> str: ...

    def standard(self, content: str, prior: str | None, content_type: str, budget: int) -> str: ...

    def chunk(self, content: str, index: int, total: int, budget: int) -> str: ...

    def synthesize(self, summaries: Sequence[str], prior: str | None, budget: int) -> str: ...

    def map(self, fn: Callable[[T], R], items: Sequence[T], max_concurrency: int) -> list[R]: ...

    def prepare(self, chunks: Sequence[str]) -> None: ...


class _LLMEngine:
    """Every node is one LLM call; any LLM failure becomes a SummarizationError."""

    method: Literal["llm", "extractive"] = "llm"

    def __init__(self, config: SummarizerConfig) -> None:
        assert config.llm is not None
        self.llm = config.llm

    def brief(self, content: str, prior: str | None, budget: int) -> str:
        if prior is None:
            prompt = prompts.BRIEF_PROMPT.format(content=content)
        else:
            prompt = prompts.ROLLING_PROMPT.format(
                length="a single sentence", prior_summary=prior, content=content
            )
        return self._ask("brief summary", prompt, budget)

    def standard(self, content: str, prior: str | None, content_type: str, budget: int) -> str:
        template = prompts.prompt_for_content_type(content_type)
        prompt = template.format(prior_context=prompts.prior_context(prior), content=content)
        return self._ask("standard summary", prompt, budget)

    def chunk(self, content: str, index: int, total: int, budget: int) -> str:
        prompt = prompts.CHUNK_PROMPT.format(
            chunk_index=index + 1, total_chunks=total, content=content
        )
        return self._ask(f"chunk {index + 1}/{total} summary", prompt, budget)

    def synthesize(self, summaries: Sequence[str], prior: str | None, budget: int) -> str:
        numbered = "\n\n".join(f"[{i + 1}] {text}" for i, text in enumerate(summaries))
        prompt = prompts.META_PROMPT.format(
            prior_context=prompts.prior_context(prior), summaries=numbered
        )
        return self._ask("synthesis", prompt, budget)

    def map(self, fn: Callable[[T], R], items: Sequence[T], max_concurrency: int) -> list[R]:
        return self.llm.map(fn, items, max_concurrency=max_concurrency)

    def prepare(self, chunks: Sequence[str]) -> None:
        """Nothing to prepare: each chunk is one call."""

    def _ask(self, step: str, prompt: str, budget: int) -> str:
        messages = [
            {"role": "system", "content": prompts.SUMMARY_SYSTEM_PROMPT},
            {"role": "user", "content": prompt},
        ]
        try:
            answer = self.llm.complete(messages, max_tokens=max(MIN_MAX_TOKENS, 2 * budget))
        except LLMError as exc:
            raise SummarizationError(f"{step} failed: {exc}") from exc
        return answer.strip()


class _ExtractiveEngine:
    """Selects the most central, least redundant sentences under each node's token budget."""

    method: Literal["llm", "extractive"] = "extractive"

    def brief(self, content: str, prior: str | None, budget: int) -> str:
        text, labelled = _with_prior(content, prior), _line_count(prior)
        return extract_sentences(text, budget, max_sentences=1, labelled_lines=labelled)

    def standard(self, content: str, prior: str | None, content_type: str, budget: int) -> str:
        text, labelled = _with_prior(content, prior), _line_count(prior)
        return extract_sentences(text, budget, labelled_lines=labelled)

    def __init__(self) -> None:
        #: chunk -> its sentences, from `prepare`
        self._units: dict[str, list[str]] = {}

    def prepare(self, chunks: Sequence[str]) -> None:
        """Cut the chunks into sentences."""
        self._units = {text: extraction_units(text) for text in chunks}

    def chunk(self, content: str, index: int, total: int, budget: int) -> str:
        return extract_sentences(content, budget, units=self._units.pop(content, None))

    def synthesize(self, summaries: Sequence[str], prior: str | None, budget: int) -> str:
        text = _with_prior("\n".join(summaries), prior)
        return extract_sentences(text, budget, labelled_lines=_line_count(text))

    def map(self, fn: Callable[[T], R], items: Sequence[T], max_concurrency: int) -> list[R]:
        return [fn(item) for item in items]  # CPU-bound numpy work: threads would not help


def _with_prior(content: str, prior: str | None) -> str:
    """Rolling extraction: sentences of the prior summary compete with the new content's."""
    return content if prior is None else prior + "\n" + content


def _line_count(text: str | None) -> int:
    """How many lines `text` has (none for no text)."""
    return 0 if text is None else text.count("\n") + 1


def split_sentences(text: str) -> list[str]:
    """Sentences and lines of `text`, stripped, empty ones dropped."""
    return _sentences(_SENTENCE_SPLIT.split(text))


def _sentences(parts: list[str]) -> list[str]:
    """The sentences of a split (every other part: the others are the separators)."""
    return [part.strip() for part in parts[::2] if part and part.strip()]


def extraction_units(text: str, *, labelled_lines: int = 0) -> list[str]:
    """The sentences of `text` an extractive summary chooses from.

    Headers, label lines and superseded turns are left out; list markers are dropped; a later
    sentence of a turn keeps its speaker's label ("Sam: ..."); a sentence that starts
    with a pronoun pointing back ("This", "It", "He", ...) is joined to the sentence before it,
    so it is never shown without what it refers to (and is left out when nothing precedes it).
    The first `labelled_lines` lines are summaries (a prior summary, the summaries a synthesis
    reads): their sentences carry their own speakers' labels already, and a line holds several
    speakers' ("Sam: A. Kim: B." must not become "Sam: Kim: B."), so none is added there.
    """
    units: list[str] = []
    for index, line in enumerate(text.split("\n")):
        if line.startswith(SUPERSEDED_MARK):
            continue
        label = _SPEAKER_LABEL.match(line)
        for number, sentence in enumerate(_sentences(_LINE_SENTENCE_SPLIT.split(line))):
            # The regular expressions only where they can match: most sentences end in neither
            # ":" nor "]" and start with no list marker.
            if sentence[-1] in ":]" and _STRUCTURE_LINE.search(sentence):
                continue
            if sentence[0] in "-*•":
                sentence = _LIST_MARKER.sub("", sentence)
            # The pattern only where it can match: a pronoun first, or a label before it.
            if (sentence[0] in _ANAPHOR_INITIALS or ":" in sentence) and _ANAPHOR_START.match(
                sentence
            ):
                if units:
                    units[-1] = f"{units[-1]} {sentence}"
                continue
            if number and label and index >= labelled_lines:  # who said a turn's later ones
                sentence = f"{label.group(1)}: {sentence}"
            units.append(sentence)
    return units


def extract_sentences(
    text: str,
    budget: int,
    max_sentences: int | None = None,
    *,
    units: list[str] | None = None,
    labelled_lines: int = 0,
) -> str:
    """The most central sentences of `text` that fit in `budget` tokens, in original order.

    Centrality is the cosine between a sentence's TF-IDF vector and the text's centroid; a
    penalty for similarity to already chosen sentences spreads the selection over the topics.
    When no sentence fits, the most central one is cut to the budget. The candidates are
    `extraction_units` (no headers, no pronoun without its referent; `labelled_lines` as
    there), or `units` when the caller cut `text` already.
    """
    sentences = extraction_units(text, labelled_lines=labelled_lines) if units is None else units
    if not sentences:
        return ""
    # Speaker labels ("Gina: ...") are in every line of a chat: as words they would make
    # "Thanks, Gina!" look central. Short pleasantries carry nothing worth keeping either.
    stopwords = _STOPWORDS | _speaker_labels(text)
    words = _content_words(sentences, stopwords)
    substantial = [len(content) >= MIN_CONTENT_WORDS for content in words]
    if not any(substantial):
        substantial = [True] * len(sentences)
    sizes, counted = _known_sizes(sentences)
    vectors = _tfidf(words)
    centroid = vectors.mean(axis=0)
    norm = float(np.linalg.norm(centroid))
    centrality = vectors @ (centroid / norm) if norm > 0 else np.zeros(len(sentences))
    limit = max_sentences or len(sentences)

    # Greedy selection over whole arrays: each round takes the best-scoring sentence that
    # still fits (the first one on ties), then raises every sentence's redundancy to its
    # similarity with the one just taken (the max over the chosen ones). Only the chosen
    # sentences' similarities are computed: a dozen columns, not the whole square.
    available = np.asarray(substantial, dtype=bool)
    redundancy = np.zeros(len(sentences))
    chosen: list[int] = []
    used = 0
    while len(chosen) < limit:
        eligible = available & (sizes <= budget - used)
        if chosen:
            eligible &= centrality > 0  # no content words: only taken when nothing else is
        scores = np.where(eligible, centrality - _REDUNDANCY_PENALTY * redundancy, -np.inf)
        best = int(np.argmax(scores))
        # A size not counted yet is a lower bound: it can only wrongly admit a sentence, so the
        # best one is counted, and set aside for the next best when it does not fit after all.
        while eligible[best] and not counted[best]:
            sizes[best], counted[best] = sentence_tokens([sentences[best]])[0], True
            if sizes[best] <= budget - used:
                break
            eligible[best], scores[best] = False, -np.inf
            best = int(np.argmax(scores))
        if not eligible[best]:
            break
        chosen.append(best)
        used += int(sizes[best])
        available[best] = False
        redundancy = np.maximum(redundancy, vectors @ vectors[best])

    if not chosen:
        most_central = int(np.argmax(centrality))
        return _split_by_tokens(sentences[most_central], max(1, budget))[0].strip()
    return " ".join(sentences[i] for i in sorted(chosen))


def sentence_tokens(sentences: Sequence[str]) -> list[int]:
    """Token counts of candidate sentences, each distinct sentence counted once per process.

    The same sentences compete again and again: an L2 or L3 node chooses among the sentences
    its L1s chose, a rolling summary's prior among the new ones, and a conversation repeats
    itself; counting each anew was most of the extractive summarizer's time.
    """
    known = _SENTENCE_TOKENS
    missing = [sentence for sentence in dict.fromkeys(sentences) if sentence not in known]
    if missing and len(known) + len(missing) > _SENTENCE_TOKENS_MAX:
        # Bounded: a worker process lives on for the next stages. Emptied, the cache no longer
        # holds the sentences that were known a moment ago: every one is counted now.
        known.clear()
        missing = list(dict.fromkeys(sentences))
    if missing:
        known.update(zip(missing, count_tokens_batch(missing), strict=True))
    return [known[sentence] for sentence in sentences]


def _known_sizes(sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's token count where this process counted it already, else a lower bound
    (`_fewest_tokens`); and which of them are counts.

    A summary takes a tenth of its candidates at most, and the sizes of the others only
    need to exceed what is left of the budget: counting them all was a third of the
    extractive summarizer's time. Without cl100k's pre-tokenizer, every sentence is counted.
    """
    encoding = get_encoding()
    if encoding is None or getattr(encoding, "_pat_str", None) != CL100K_PATTERN:
        return np.asarray(sentence_tokens(sentences)), np.ones(len(sentences), dtype=bool)
    known = [_SENTENCE_TOKENS.get(sentence) for sentence in sentences]
    sizes = [
        size if size is not None else _fewest_tokens(sentence)
        for size, sentence in zip(known, sentences, strict=True)
    ]
    return np.asarray(sizes, dtype=np.int64), np.asarray([size is not None for size in known])


def _fewest_tokens(sentence: str) -> int:
    """A lower bound of the sentence's cl100k token count: its words, when it is spaced plainly.

    cl100k's pre-tokenizer lets a piece hold a space only as its first character or among
    other whitespace, so two words with a space between never share a piece, and every piece
    is a token at least. Printable, single-spaced text has no other whitespace to hide a word
    in; for anything else the bound is 1 (0 for nothing).
    """
    if not sentence:
        return 0
    plain = sentence.isprintable() and "  " not in sentence
    if plain and not sentence.startswith(" ") and not sentence.endswith(" "):
        return sentence.count(" ") + 1
    return 1


def _speaker_labels(text: str) -> frozenset[str]:
    """Lower-cased words of the `Name:` labels that start lines of a transcript."""
    words: set[str] = set()
    for label in _SPEAKER_LABEL.findall(text):
        words.update(label.lower().split())
    return frozenset(words)


def _content_words(sentences: Sequence[str], stopwords: frozenset[str]) -> list[list[str]]:
    """The lower-cased words of each sentence that are not stopwords (`_WORD`'s matches).

    One pass over all the sentences at once, a line break between two: no word crosses one,
    and a call per sentence cost more than the words themselves. Every character no word
    holds becomes a space, so `str.split` finds the words (10-20% less time than the regular
    expression's pass); only a run with an apostrophe is cut by `_WORD` itself ("'tis" is
    "tis", "rock'n'roll" is "rock'n" and "roll")."""
    joined = "\n".join(sentences)
    if not sentences or joined.count("\n") != len(sentences) - 1:  # none, or a break in one
        return [[w for w in _WORD.findall(s.lower()) if w not in stopwords] for s in sentences]
    spaced = joined.lower().encode("ascii", "replace").translate(_WORD_BYTES).decode("ascii")
    return [
        [
            word
            for run in line.split()
            for word in (_WORD.findall(run) if "'" in run else (run,))
            if word not in stopwords
        ]
        for line in spaced.split("\n")
    ]


def _tfidf(words: Sequence[Sequence[str]]) -> np.ndarray:
    """Row-normalized TF-IDF matrix (sublinear tf) over the content words of each sentence."""
    every = list(itertools.chain.from_iterable(words))
    vocabulary = {word: i for i, word in enumerate(sorted(set(every)))}
    rows = np.repeat(np.arange(len(words)), [len(ws) for ws in words])
    columns = np.fromiter(map(vocabulary.__getitem__, every), np.int64, len(every))
    # Each (sentence, word) pair once, with how often the word occurs in the sentence.
    pairs, counts = np.unique(rows * len(vocabulary) + columns, return_counts=True)
    sublinear = [0.0] + [1.0 + math.log(n) for n in range(1, 1 + int(counts.max(initial=0)))]
    # The sentences each word is in: one (sentence, word) pair each. Weights are set on the
    # pairs only; the rest of the matrix stays zero, as zero times the weight would leave it.
    pair_words = pairs % max(1, len(vocabulary))
    document_frequency = np.bincount(pair_words, minlength=len(vocabulary))
    weights = np.log((1 + len(words)) / (1 + document_frequency)) + 1.0
    values = np.asarray(sublinear)[counts] * weights[pair_words]
    # Rows normalized on the pairs, before they are spread into the (mostly zero) matrix.
    pair_rows = pairs // max(1, len(vocabulary))
    norms = np.sqrt(np.bincount(pair_rows, weights=values * values, minlength=len(words)))
    matrix = np.zeros((len(words), len(vocabulary)))
    matrix.flat[pairs] = values / norms[pair_rows]
    return matrix


def _budget(ratio: float, tokens: int) -> int:
    return max(1, round(ratio * tokens))


def _result(
    level: SummaryLevel,
    summary: str | None,
    tree: HierarchicalSummary | None,
    input_tokens: int,
    method: Literal["llm", "extractive"],
) -> SummaryResult:
    if summary is None:
        return SummaryResult(
            level=level,
            summary=None,
            input_tokens=input_tokens,
            output_tokens=0,
            compression_ratio=1.0,
            method=method,
        )
    output_tokens = count_tokens(summary)
    ratio = output_tokens / input_tokens if input_tokens else 1.0
    return SummaryResult(
        level=level,
        summary=summary,
        hierarchical=tree,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        compression_ratio=min(1.0, max(0.0, ratio)),
        method=method,
    )
