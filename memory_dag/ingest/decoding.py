"""Bytes of a workspace file → its text, one line convention, bad lines left out.

A file is text in UTF-8, or in UTF-16/UTF-32 (a byte order mark, or UTF-16 whose characters
are at least a quarter ASCII); a NUL in its first 8 KiB otherwise makes it binary. A line that
is not valid UTF-8, or that is longer than `MAX_LINE_CHARS`, is left out as an empty line (so
line numbers stay what editors show) and reported; the file's other lines are kept.
"""

from __future__ import annotations

import re

from memory_dag.ingest.limits import MAX_LINE_CHARS

#: How much of a file is checked for NUL bytes to call it binary.
BINARY_SNIFF_BYTES = 8192

#: A problem found while decoding: (1-based line, or None for the whole file; reason).
Problem = tuple[int | None, str]

#: Line breaks as the text is split (CRLF, CR or LF), also for per-line decoding.
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")

#: Control characters that text files do not hold (tab, newline and carriage return do).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def decode_text(data: bytes) -> tuple[str | None, list[Problem]]:
    """(text with `\\n` line breaks, problems); text is None for a binary or undecodable file."""
    text, problems = _decode(data)
    if text is None:
        return None, problems
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    text, long_lines = _without_long_lines(text)
    return text, problems + long_lines


def _decode(data: bytes) -> tuple[str | None, list[Problem]]:
    wide = _wide_encoding(data[:BINARY_SNIFF_BYTES])
    if wide is not None:
        try:
            text = data.decode(wide)
        except UnicodeDecodeError as exc:
            if wide in ("utf-16", "utf-32"):  # it said so with a byte order mark
                return None, [(None, f"not valid {wide} at byte {exc.start}")]
        else:
            if not _CONTROL.search(text):
                return text, []
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return None, [(None, "binary file")]
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError:
        pass
    lines: list[str] = []
    problems: list[Problem] = []
    for number, raw in enumerate(_LINE_BREAK.split(data), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            lines.append("")
            reason = f"not valid UTF-8 at byte {exc.start} of the line; line left out"
            problems.append((number, reason))
    return "\n".join(lines), problems


def _wide_encoding(head: bytes) -> str | None:
    """ "utf-32" / "utf-16" (with a byte order mark), "utf-16-le" / "-be" (without), or None."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    if len(head) < 4 or b"\x00" not in head:
        return None
    even, odd = head[0::2], head[1::2]
    # Without a mark: UTF-16 whose characters are at least a quarter ASCII has the zero bytes
    # of those on one side only.
    if b"\x00" not in even and odd.count(0) * 4 >= len(odd):
        return "utf-16-le"
    if b"\x00" not in odd and even.count(0) * 4 >= len(even):
        return "utf-16-be"
    return None


def _without_long_lines(text: str) -> tuple[str, list[Problem]]:
    """Leave out (as empty lines) lines over `MAX_LINE_CHARS`, each with a problem."""
    if len(text) <= MAX_LINE_CHARS:
        return text, []
    lines = text.split("\n")
    problems: list[Problem] = []
    for index, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            lines[index] = ""
            reason = (
                f"line is {len(line):,} characters, over the limit of {MAX_LINE_CHARS:,}; "
                "line left out"
            )
            problems.append((index + 1, reason))
    return "\n".join(lines), problems


def is_utf8(text: str) -> bool:
    """False for text holding lone surrogates (from `\\ud800` escapes or undecodable file
    names), which cannot be stored."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
