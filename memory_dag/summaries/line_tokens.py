"""Token counts and ids of stretches of one text, each of its lines encoded once at most.

Summarizing a long input counts the whole text, then each paragraph, then each chunk: three
encodings of the same characters, most of the extractive summarizer's tokenizer time. They
can share one: cl100k's pre-tokenizer (`CL100K_PATTERN`) never lets a piece run from a line
break into a character that is not whitespace (no alternative reaches past a `\\n` into one),
and what it cuts before such a place does not depend on what follows it. So a text cut there
("clean cuts") encodes as its stretches encoded alone, one after the other: the tokens of a
stretch that starts at a clean cut are those of the whole lines it spans, then those of the
part of its last line, encoded alone. `tests/summaries/test_line_tokens.py` compares the counts
and ids with tiktoken's on random texts.

Most lines need not be encoded even once: a conversation's turns were counted when they were
chunked (`chunks.tokens`), and a line is such a turn followed by its line breaks. Its count is
the turn's plus what the breaks add (`_breaks_add`); its ids are encoded only when asked for
(a chunk's overlap needs the ids of its last lines, not of all of them).
"""

from __future__ import annotations

import itertools
import re
import string
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

import tiktoken

from memory_dag.ingest.tokens import CL100K_PATTERN, count_tokens_cached, get_encoding

#: A clean cut: just after a line break, just before a character that is not whitespace.
#: Python's `\S` excludes every `str.isspace()` character, a superset of the Unicode
#: whitespace the tokenizer's `\s` means: where it sees a cut, the tokenizer sees one too.
_CLEAN_CUT = re.compile(r"(?<=\n)(?=\S)")

#: ASCII characters by the pre-tokenizer's classes: letters and digits (`\p{L}`, `\p{N}`), and
#: the others that are not whitespace (`[^\s\p{L}\p{N}]`, the class that takes in line breaks
#: that follow it).
_LETTERS_AND_DIGITS = frozenset(string.ascii_letters + string.digits)
_PUNCTUATION = frozenset(string.punctuation)

#: A stretch of the text whose token count is known: (start, end, tokens).
Counted = tuple[int, int, int]


class LineTokens:
    """One text, encoded line by line; counts and ids of its stretches from the lines'."""

    def __init__(
        self, text: str, encoding: tiktoken.Encoding, counted: Iterable[Counted] = ()
    ) -> None:
        self.text = text
        self._encode = encoding.encode_ordinary
        self._cuts = [0, *(m.start() for m in _CLEAN_CUT.finditer(text)), len(text)]
        #: start -> (end, tokens) of the stretches counted already
        self._counted = {start: (end, tokens) for start, end, tokens in counted}
        #: Each line's ids; None until asked for (its count came from a counted stretch).
        self._ids: list[list[int] | None] = []
        counts: list[int] = []
        for start, end in itertools.pairwise(self._cuts):
            count = self._known_count(start, end)
            if count is None:
                ids = self._encode(text[start:end])
                self._ids.append(ids)
                count = len(ids)
            else:
                self._ids.append(None)
            counts.append(count)
        self._before = list(itertools.accumulate(counts, initial=0))

    @classmethod
    def of(cls, text: str, counted: Iterable[Counted] = ()) -> LineTokens | None:
        """The text's line tokens (`counted`: stretches whose token counts are known); None
        when the encoding is not cl100k's (or none loads), where the clean cuts are not known
        to hold."""
        encoding = get_encoding()
        if encoding is None or getattr(encoding, "_pat_str", None) != CL100K_PATTERN:
            return None
        return cls(text, encoding, counted)

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
        return self._before[last] - self._before[first] + self._tail_count(last, end)

    def count_and_last_ids(self, start: int, end: int, wanted: int) -> tuple[int, list[int]]:
        """The token count of `text[start:end]` and its last `wanted` tokens (all of them when
        it has fewer); `start` must be a clean cut. Only the lines those tokens are in are
        encoded."""
        first, last = self._span(start, end)
        tail = self._tail_ids(last, end)
        count = self._before[last] - self._before[first] + len(tail)
        if wanted <= 0:
            return count, []
        line, have = last, len(tail)
        while line > first and have < wanted:
            line -= 1
            have += self._before[line + 1] - self._before[line]
        lines = (self._line_ids(n) for n in range(line, last))
        ids = [*itertools.chain.from_iterable(lines), *tail]
        return count, ids[max(0, len(ids) - wanted) :]

    def _span(self, start: int, end: int) -> tuple[int, int]:
        """The lines from the one starting at `start` to the one `end` falls in (or ends)."""
        first = bisect_left(self._cuts, start)
        if first == len(self._cuts) or self._cuts[first] != start or end < start:
            raise ValueError(f"{start} is not a clean cut before {end}")
        return first, max(first, bisect_right(self._cuts, end) - 1)

    def _line_ids(self, line: int) -> list[int]:
        ids = self._ids[line]
        if ids is None:
            ids = self._ids[line] = self._encode(self.text[self._cuts[line] : self._cuts[line + 1]])
        return ids

    def _tail_count(self, line: int, end: int) -> int:
        """The token count of the part of `line` before `end`."""
        start = self._cuts[line]
        if start >= end:
            return 0
        counted = self._counted.get(start)
        if counted is not None and counted[0] == end and self._known_span(start, end):
            return counted[1]
        return len(self._encode(self.text[start:end]))

    def _tail_ids(self, line: int, end: int) -> list[int]:
        start = self._cuts[line]
        return self._encode(self.text[start:end]) if start < end else []

    def _known_count(self, start: int, end: int) -> int | None:
        """The count of the line `text[start:end]` from a counted stretch that starts it, when
        the rest of the line is line breaks; None when it must be encoded."""
        counted = self._counted.get(start)
        if counted is None:
            return None
        stretch_end, tokens = counted
        if not start < stretch_end <= end or not self._known_span(start, stretch_end):
            return None
        breaks = self.text[stretch_end:end]
        if breaks.strip("\n"):
            return None
        added = _breaks_add(self.text[start:stretch_end], breaks)
        return None if added is None else tokens + added

    def _known_span(self, start: int, end: int) -> bool:
        """Whether a count of `text[start:end]` can stand for it here: it holds no line break
        (which would make a clean cut, or join the break after it)."""
        return "\n" not in self.text[start:end] and "\r" not in self.text[start:end]


def _breaks_add(stretch: str, breaks: str) -> int | None:
    """How many tokens `breaks` (line breaks only) add after `stretch` (no line break), both
    encoded as one text; None when this is not known without encoding `stretch`.

    The pre-tokenizer cuts `stretch + breaks` as it cuts `stretch`, except where `stretch`
    ends (its whitespace look-aheads only see whitespace followed by more text):
    - after a letter or digit, the breaks are a piece of their own;
    - after a run of other characters (`[^\\s\\p{L}\\p{N}]`, with one space before it or
      not), the breaks join that run's piece, whose encoding may change.
    Only ASCII ends are handled; anything else is encoded.
    """
    if not breaks:
        return 0
    last = stretch[-1]
    if last in _LETTERS_AND_DIGITS:
        return count_tokens_cached(breaks)
    if last not in _PUNCTUATION:
        return None
    run = len(stretch) - 1
    while run > 0 and stretch[run - 1] in _PUNCTUATION:
        run -= 1
    if run > 0 and stretch[run - 1] == " ":
        run -= 1
    elif run > 0 and stretch[run - 1] not in _LETTERS_AND_DIGITS:
        return None  # non-ASCII, or whitespace other than one space, before the run
    piece = stretch[run:]
    return count_tokens_cached(piece + breaks) - count_tokens_cached(piece)
