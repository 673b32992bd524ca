"""Chunking of notes and transcripts, checked against real cl100k token counts."""

from __future__ import annotations

import pytest

from memory_dag.ingest.chunking import Chunk, chunk_lines, chunk_turns
from memory_dag.ingest.sources import Turn, render_turn
from memory_dag.ingest.tokens import (
    count_tokens,
    count_tokens_batch,
    decode,
    encode,
    get_encoding,
    split_by_tokens,
)

WORDS = ["memory", "agent", "Lisbon", "pizza", "Anne", "Harbor", "route", "vans", "demo"]


def note_lines(count: int) -> list[str]:
    """Lines of varied length (a few to ~60 tokens), with some blank lines and headings."""
    lines = []
    for i in range(count):
        if i % 11 == 5:
            lines.append("")
        elif i % 13 == 0:
            lines.append(f"## Section {i}")
        else:
            words = (WORDS[(i + k) % len(WORDS)] for k in range(i % 50))
            lines.append(f"- item {i}: " + " ".join(words))
    return lines


def make_turns(count: int, first_line: int = 2) -> list[Turn]:
    return [
        Turn(
            id=f"t{i}",
            session_id="s1",
            conversation_id="c1",
            role="user" if i % 2 == 0 else "assistant",
            speaker="Sam" if i % 2 == 0 else None,
            content=" ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + (i * 7) % 40)),
            event_time=None,
            line=first_line + 2 * i,  # leave gaps, as skipped JSONL lines do
        )
        for i in range(count)
    ]


def assert_within_budget(chunks: list[Chunk], max_tokens: int) -> None:
    for chunk in chunks:
        assert chunk.tokens == count_tokens(chunk.text)
        assert 0 < chunk.tokens <= max_tokens
        assert chunk.text.strip()


# --- tokens ----------------------------------------------------------------------------------


def test_tokens_use_the_bundled_cl100k_encoding_offline() -> None:
    assert get_encoding() is not None
    assert encode("hello world") == [15339, 1917]  # cl100k_base ids
    assert decode(encode("Sam's wife is Anne.")) == "Sam's wife is Anne."
    assert count_tokens("hello world") == 2


def test_special_token_text_is_counted_as_plain_text() -> None:
    text = "user pasted <|endoftext|> into the chat"
    assert count_tokens(text) == len(encode(text)) > 5


def test_count_tokens_batch_matches_single_counts() -> None:
    texts = ["", "hello world", "Olá, São Paulo! 🍕🍕", "x" * 1000]
    assert count_tokens_batch(texts) == [count_tokens(t) for t in texts]


def test_split_by_tokens_respects_limit_and_loses_nothing() -> None:
    text = "Pizza 🍕 in Lisboa, ça va? 東京タワー " * 60
    pieces = split_by_tokens(text, 17)
    assert "".join(pieces) == text
    assert len(pieces) > 1
    assert all(count_tokens(piece) <= 17 for piece in pieces)


# --- chunk_lines -----------------------------------------------------------------------------


@pytest.mark.parametrize(("max_tokens", "overlap"), [(400, 80), (120, 30), (60, 0)])
def test_chunk_lines_respects_token_limit_and_line_numbers(max_tokens: int, overlap: int) -> None:
    lines = note_lines(300)
    first_line = 5  # e.g. body after four lines of front matter

    chunks = chunk_lines("\n".join(lines), first_line, max_tokens, overlap)

    assert len(chunks) > 3
    assert_within_budget(chunks, max_tokens)
    for chunk in chunks:
        expected = lines[chunk.start_line - first_line : chunk.end_line - first_line + 1]
        assert chunk.text == "\n".join(expected)
        assert chunk.turn_ids == []
    covered = {n for c in chunks for n in range(c.start_line, c.end_line + 1)}
    non_blank = {first_line + i for i, line in enumerate(lines) if line.strip()}
    assert non_blank <= covered
    assert [c.start_line for c in chunks] == sorted(c.start_line for c in chunks)


def test_chunk_lines_packs_as_many_lines_as_fit() -> None:
    lines = [line for line in note_lines(200) if line.strip()]
    counts = count_tokens_batch(lines)

    chunks = chunk_lines("\n".join(lines), max_tokens=150, overlap=0)

    for chunk, following in zip(chunks, chunks[1:], strict=False):
        used = counts[chunk.start_line - 1 : chunk.end_line]
        budget = sum(used) + len(used) - 1
        next_line = counts[chunk.end_line]  # the line that did not fit (0-based = end_line)
        assert budget + 1 + next_line > 150
        assert following.start_line == chunk.end_line + 1  # no overlap requested, no gap


def test_chunk_lines_carries_trailing_lines_as_overlap() -> None:
    lines = [f"Line {i}: " + "word " * 7 for i in range(40)]  # 12 tokens per line
    assert set(count_tokens_batch(lines)) == {12}

    chunks = chunk_lines("\n".join(lines), max_tokens=60, overlap=26)

    # 60 tokens hold 4 lines (4 * 12 + 3 newlines = 51; a fifth would need 64).
    # 26 tokens of overlap carry two whole lines (12 + 1 + 12 = 25), not three (38).
    assert [(c.start_line, c.end_line) for c in chunks[:3]] == [(1, 4), (3, 6), (5, 8)]
    assert chunks[-1].end_line == 40
    assert_within_budget(chunks, 60)


def test_chunk_lines_splits_a_line_longer_than_the_limit() -> None:
    long_line = "Harbor routing notes: " + " ".join(f"stop{i}" for i in range(400))
    text = f"# Title\nshort line\n{long_line}\nafter the long line\n"

    chunks = chunk_lines(text, first_line=10, max_tokens=100, overlap=20)

    pieces = [c for c in chunks if c.start_line == c.end_line == 12]
    assert len(pieces) >= 3
    assert "".join(p.text for p in pieces) == long_line
    assert_within_budget(chunks, 100)
    assert (chunks[0].start_line, chunks[0].end_line, chunks[0].text) == (
        10,
        11,
        "# Title\nshort line",
    )
    assert (chunks[-1].start_line, chunks[-1].text) == (13, "after the long line")


def test_chunk_lines_skips_whitespace_and_trims_blank_edges() -> None:
    assert chunk_lines("") == []
    assert chunk_lines("\n   \n\t\n") == []

    [chunk] = chunk_lines("\n\nfirst\n\nsecond\n\n", first_line=3)

    assert (chunk.start_line, chunk.end_line, chunk.text) == (5, 7, "first\n\nsecond")


def test_chunk_lines_rejects_impossible_settings() -> None:
    with pytest.raises(ValueError):
        chunk_lines("text", max_tokens=0)
    with pytest.raises(ValueError):
        chunk_lines("text", overlap=-1)


# --- chunk_turns -----------------------------------------------------------------------------


def test_chunk_turns_keeps_every_turn_id_in_order_within_budget() -> None:
    turns = make_turns(120)
    by_id = {t.id: t for t in turns}

    chunks = chunk_turns(turns, max_tokens=120, overlap=30)

    assert_within_budget(chunks, 120)
    assert {i for c in chunks for i in c.turn_ids} == set(by_id)
    for chunk in chunks:
        held = [by_id[i] for i in chunk.turn_ids]
        assert chunk.text == "\n".join(render_turn(t) for t in held)
        assert (chunk.start_line, chunk.end_line) == (held[0].line, held[-1].line)
        assert [t.line for t in held] == sorted(t.line for t in held)
    # Overlap: some neighbouring chunks share their boundary turns.
    shared = [set(a.turn_ids) & set(b.turn_ids) for a, b in zip(chunks, chunks[1:], strict=False)]
    assert any(shared)
    assert all(count_tokens("\n".join(render_turn(by_id[i]) for i in s)) <= 30 for s in shared)


def test_chunk_turns_with_max_turns_one_gives_one_chunk_per_turn() -> None:
    turns = make_turns(30)

    chunks = chunk_turns(turns, max_turns=1)

    assert [c.turn_ids for c in chunks] == [[t.id] for t in turns]
    assert [(c.start_line, c.end_line) for c in chunks] == [(t.line, t.line) for t in turns]
    assert [c.text for c in chunks] == [render_turn(t) for t in turns]


def test_chunk_turns_max_turns_caps_and_still_overlaps() -> None:
    turns = make_turns(20)

    chunks = chunk_turns(turns, max_tokens=4000, overlap=4000, max_turns=3)

    assert all(len(c.turn_ids) <= 3 for c in chunks)
    assert chunks[0].turn_ids == ["t0", "t1", "t2"]
    assert chunks[1].turn_ids == ["t1", "t2", "t3"]  # two carried, one new
    assert chunks[-1].turn_ids[-1] == "t19"


def test_chunk_turns_splits_a_long_turn_keeping_its_id_and_line() -> None:
    turns = make_turns(3)
    long_turn = Turn("long", "s1", "c1", "user", "Sam", "pizza " * 500, None, 99)

    chunks = chunk_turns([turns[0], long_turn, turns[1]], max_tokens=100, overlap=20)

    pieces = [c for c in chunks if c.turn_ids == ["long"]]
    assert len(pieces) >= 5
    assert all((p.start_line, p.end_line) == (99, 99) for p in pieces)
    assert "".join(p.text for p in pieces) == render_turn(long_turn)
    assert_within_budget(chunks, 100)
    assert {i for c in chunks for i in c.turn_ids} == {"t0", "long", "t1"}


def test_chunk_turns_empty_and_invalid() -> None:
    assert chunk_turns([]) == []
    with pytest.raises(ValueError):
        chunk_turns(make_turns(2), max_turns=0)
