"""What a summary was made from: the turns, facts and entries of its input, and where each
sits in the text the summarizer reads, so every node of a tree can name its `source_ids`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from memory_dag.scope import read_as


@dataclass(frozen=True)
class Source:
    """One turn, fact or entry of the input: its id, where its text sits in the content, and
    the category it reads as (turns and entries: `uncategorized`)."""

    id: str
    start: int
    end: int
    category: str


class Content:
    """The summarizer's input text, built piece by piece, remembering where each source is."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.sources: list[Source] = []
        self._uncategorized = read_as(None)  # looked up once: a conversation adds thousands

    def add(self, text: str, source_id: str | None = None, category: str | None = None) -> None:
        if source_id is not None:
            end = self.length + len(text)
            read = category if category is not None else self._uncategorized
            self.sources.append(Source(source_id, self.length, end, read))
        self.parts.append(text)
        self.length += len(text)

    def text(self) -> tuple[str, tuple[Source, ...]]:
        """The stripped text and the sources' spans in it."""
        raw = "".join(self.parts)
        lead = len(raw) - len(raw.lstrip())
        if not lead:  # nothing to shift (a transcript starts with its first session's header)
            return raw.strip(), tuple(self.sources)
        shifted = tuple(
            Source(s.id, s.start - lead, s.end - lead, s.category) for s in self.sources
        )
        return raw.strip(), shifted


def chunk_sources(
    content: str, sources: Sequence[Source], chunks: Sequence[str]
) -> list[list[Source]]:
    """The sources each chunk holds. The chunks are the summarizer's own chunking of `content`
    (`summarizer.chunk_text`, deterministic): stretches of it, in order; a source in the overlap
    of two chunks belongs to both."""
    covered: list[list[Source]] = []
    starts = [s.start for s in sources]
    ends = [s.end for s in sources]
    # Sources in text order (as `Content` adds them): those a stretch overlaps are one run,
    # found by bisection (a scan of all a chunk was ~0.3 s at 100k turns).
    ordered = all(a <= b for a, b in pairwise(starts)) and all(a <= b for a, b in pairwise(ends))
    position = 0
    for chunk in chunks:
        start = content.find(chunk, position)
        if start < 0:  # not found as one stretch: fall back to the sources whose text it holds
            covered.append([s for s in sources if content[s.start : s.end] in chunk])
            continue
        end = start + len(chunk)
        if ordered:
            covered.append(list(sources[bisect_right(ends, start) : bisect_left(starts, end)]))
        else:
            covered.append([s for s in sources if s.start < end and s.end > start])
        position = start
    return covered
