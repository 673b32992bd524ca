"""Cut notes and transcripts into chunks that fit an embedding/search budget.

Both chunkers pack whole units (a Markdown line, or one rendered transcript turn) until the next
would exceed `max_tokens`, then start the next chunk with the trailing units of the previous one
(at most `overlap` tokens) so that a fact on a chunk border is found from either side. A unit
longer than `max_tokens` on its own is cut into token pieces, each its own chunk.

Tokens are counted once per unit, not once per growing chunk (that would be quadratic). A
chunk's budget is the sum of its units plus one token per joining newline: cl100k's pre-tokenizer
keeps a newline apart from the next line's words (at most it merges into trailing spaces or
punctuation of the previous line), so the joined text does not tokenize longer than that.
`Chunk.tokens` is the exact count of the chunk's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memory_dag.ingest.sources import Turn, render_turn
from memory_dag.ingest.tokens import count_tokens, count_tokens_batch, split_by_tokens


@dataclass(slots=True)
class Chunk:
    """A piece of a file to embed and index; lines are 1-based line numbers in the source file."""

    start_line: int
    end_line: int
    text: str
    tokens: int
    turn_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Unit:
    """What the packer moves around: one line or one turn, already rendered and counted."""

    line: int
    text: str
    tokens: int
    turn_id: str | None


def chunk_lines(
    text: str, first_line: int = 1, max_tokens: int = 400, overlap: int = 80
) -> list[Chunk]:
    """Chunks of Markdown text; `first_line` is the file line number of the text's first line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a final newline ends the last line; it does not start a new one
    counts = count_tokens_batch(lines)
    units = [
        _Unit(line=first_line + index, text=line, tokens=tokens, turn_id=None)
        for index, (line, tokens) in enumerate(zip(lines, counts, strict=True))
    ]
    return _pack(units, max_tokens, overlap, max_units=None)


def chunk_turns(
    turns: list[Turn],
    max_tokens: int = 400,
    overlap: int = 80,
    max_turns: int | None = None,
    counts: list[int] | None = None,
) -> list[Chunk]:
    """Chunks of transcript turns, one rendered line per turn; `max_turns` caps turns per chunk.

    Chunk line numbers are the JSONL lines of the first and last turn, and `turn_ids` lists the
    turns each chunk holds, so a search hit can always be traced back to the turns it came from.
    `counts` are the turns' rendered token counts when the caller has them already.
    """
    if max_turns is not None and max_turns < 1:
        raise ValueError("max_turns must be at least 1")
    texts = [render_turn(turn) for turn in turns]
    if counts is None:
        counts = count_tokens_batch(texts)
    elif len(counts) != len(texts):
        raise ValueError(f"{len(counts)} token counts for {len(texts)} turns")
    units = [
        _Unit(line=turn.line, text=text, tokens=tokens, turn_id=turn.id)
        for turn, text, tokens in zip(turns, texts, counts, strict=True)
    ]
    return _pack(units, max_tokens, overlap, max_units=max_turns)


def _budget(units: list[_Unit]) -> int:
    """Upper bound of the tokens of the units joined with newlines."""
    return sum(unit.tokens for unit in units) + max(len(units) - 1, 0)


def _pack(units: list[_Unit], max_tokens: int, overlap: int, max_units: int | None) -> list[Chunk]:
    """Greedy packing of units into chunks, carrying whole units over as overlap."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if overlap < 0:
        raise ValueError("overlap must not be negative")

    chunks: list[Chunk] = []
    current: list[_Unit] = []
    current_tokens = 0  # == _budget(current), kept incrementally so packing stays linear

    for unit in units:
        if unit.tokens > max_tokens:
            _emit(chunks, current)
            current, current_tokens = [], 0
            chunks.extend(_split_unit(unit, max_tokens))
            continue

        full = max_units is not None and len(current) >= max_units
        if current and (full or current_tokens + 1 + unit.tokens > max_tokens):
            _emit(chunks, current)
            current = _carry_over(current, overlap, max_units)
            # The carried units plus the new one must still fit; drop the oldest until they do.
            while current and _budget(current) + 1 + unit.tokens > max_tokens:
                current.pop(0)
            current_tokens = _budget(current)

        current_tokens += unit.tokens + (1 if current else 0)
        current.append(unit)

    _emit(chunks, current)
    return chunks


def _carry_over(units: list[_Unit], overlap: int, max_units: int | None) -> list[_Unit]:
    """The trailing units of a finished chunk whose joined tokens fit in `overlap`.

    At most max_units - 1 are carried, so the next chunk always has room for a new unit.
    """
    limit = len(units) if max_units is None else max_units - 1
    carried: list[_Unit] = []
    tokens = 0
    for unit in reversed(units):
        cost = unit.tokens + (1 if carried else 0)
        if len(carried) >= limit or tokens + cost > overlap:
            break
        carried.insert(0, unit)
        tokens += cost
    return carried


def _emit(chunks: list[Chunk], units: list[_Unit]) -> None:
    """Append a chunk of units, without leading/trailing blank lines; nothing if all blank."""
    start = 0
    end = len(units)
    while start < end and not units[start].text.strip():
        start += 1
    while end > start and not units[end - 1].text.strip():
        end -= 1
    kept = units[start:end]
    if not kept:
        return
    text = "\n".join(unit.text for unit in kept)
    chunks.append(
        Chunk(
            start_line=kept[0].line,
            end_line=kept[-1].line,
            text=text,
            tokens=kept[0].tokens if len(kept) == 1 else count_tokens(text),
            turn_ids=[unit.turn_id for unit in kept if unit.turn_id is not None],
        )
    )


def _split_unit(unit: _Unit, max_tokens: int) -> list[Chunk]:
    """One chunk per token piece of an over-long line or turn; all keep its line and turn id."""
    turn_ids = [unit.turn_id] if unit.turn_id is not None else []
    return [
        Chunk(
            start_line=unit.line,
            end_line=unit.line,
            text=piece,
            tokens=count_tokens(piece),
            turn_ids=list(turn_ids),
        )
        for piece in split_by_tokens(unit.text, max_tokens)
        if piece.strip()
    ]
