"""Token counts and ids of stretches of one text, each of its lines encoded once.

Summarizing a long input counts the whole text, then each paragraph, then each chunk: three
encodings of the same characters, most of the extractive summarizer's tokenizer time. They
can share one: cl100k's pre-tokenizer (`CL100K_PATTERN`) never lets a piece run from a line
break into a character that is not whitespace (no alternative reaches past a `\\n` into one),
and what it cuts before such a place does not depend on what follows it. So a text cut there
("clean cuts") encodes as its stretches encoded alone, one after the other: the tokens of a
stretch that starts at a clean cut are those of the whole lines it spans, then those of the
part of its last line, encoded alone. `tests/summaries/test_line_tokens.py` compares the counts
and ids with tiktoken's on random texts.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_left, bisect_right

import tiktoken

from memory_dag.ingest.tokens import CL100K_PATTERN, get_encoding

#: A clean cut: just after a line break, just before a character that is not whitespace.
#: Python's `\S` excludes every `str.isspace()` character, a superset of the Unicode
#: whitespace the tokenizer's `\s` means: where it sees a cut, the tokenizer sees one too.
_CLEAN_CUT = re.compile(r"(?<=\n)(?=\S)")


class LineTokens:
    """One text, encoded line by line; counts and ids of its stretches from the lines'."""

    def __init__(self, text: str, encoding: tiktoken.Encoding) -> None:
        self.text = text
        self._encode = encoding.encode_ordinary
        self._cuts = [0, *(m.start() for m in _CLEAN_CUT.finditer(text)), len(text)]
        self._ids = [self._encode(text[a:b]) for a, b in itertools.pairwise(self._cuts)]
        self._before = list(itertools.accumulate(map(len, self._ids), initial=0))

    @classmethod
    def of(cls, text: str) -> LineTokens | None:
        """The text's line tokens; None when the encoding is not cl100k's (or none loads),
        where the clean cuts are not known to hold."""
        encoding = get_encoding()
        if encoding is None or getattr(encoding, "_pat_str", None) != CL100K_PATTERN:
            return None
        return cls(text, encoding)

    def total(self) -> int:
        """The token count of the whole text."""
        return self._before[-1]

    def is_cut(self, position: int) -> bool:
        """Whether `position` is a clean cut (or the start or the end of the text)."""
        index = bisect_left(self._cuts, position)
        return index < len(self._cuts) and self._cuts[index] == position

    def next_cut(self, position: int) -> int:
        """The first clean cut after `position` (the end of the text when none is)."""
        return self._cuts[min(bisect_right(self._cuts, position), len(self._cuts) - 1)]

    def count(self, start: int, end: int) -> int:
        """The token count of `text[start:end]`; `start` must be a clean cut."""
        first, last = self._span(start, end)
        tail = self._encode(self.text[self._cuts[last] : end]) if self._cuts[last] < end else []
        return self._before[last] - self._before[first] + len(tail)

    def ids(self, start: int, end: int) -> list[int]:
        """The tokens of `text[start:end]`; `start` must be a clean cut."""
        first, last = self._span(start, end)
        tail = self._encode(self.text[self._cuts[last] : end]) if self._cuts[last] < end else []
        return [*itertools.chain.from_iterable(self._ids[first:last]), *tail]

    def _span(self, start: int, end: int) -> tuple[int, int]:
        """The lines from the one starting at `start` to the one `end` falls in (or ends)."""
        first = bisect_left(self._cuts, start)
        if first == len(self._cuts) or self._cuts[first] != start or end < start:
            raise ValueError(f"{start} is not a clean cut before {end}")
        return first, max(first, bisect_right(self._cuts, end) - 1)
