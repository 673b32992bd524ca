"""Line tokens: counts and ids of stretches of a text, against tiktoken's own encoding."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_dag.ingest.tokens import encode
from memory_dag.summaries.line_tokens import LineTokens
from memory_dag.summaries.summarizer import _chunks_counted

#: Characters where the pre-tokenizer's cases meet: letters, digits, contractions, punctuation
#: that swallows line breaks, spaces and other whitespace, and multi-byte characters.
ALPHABET = list("aZé9'.!?)\"-: \t\r\n\n\n") + [
    "'s",
    "\u00a0",
    "\u2003",
    "\u3000",
    "日本",
    "🙂",
    "\x1c",
]


def texts() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(ALPHABET), max_size=60).map("".join)


def spans(line_tokens: LineTokens) -> list[tuple[int, int]]:
    text = line_tokens.text
    starts = [p for p in range(len(text) + 1) if line_tokens.is_cut(p)]
    return [(start, end) for start in starts for end in range(start, len(text) + 1)]


@settings(max_examples=400, deadline=None)
@given(texts())
def test_every_stretch_from_a_clean_cut_encodes_as_alone(text: str) -> None:
    line_tokens = LineTokens.of(text)
    assert line_tokens is not None
    assert line_tokens.total() == len(encode(text))
    for start, end in spans(line_tokens):
        assert line_tokens.ids(start, end) == encode(text[start:end])
        assert line_tokens.count(start, end) == len(encode(text[start:end]))


def test_cuts_are_after_line_breaks_before_text() -> None:
    text = "Anne: hi.\nBoris: yes!\n\n[session 2]\n  indented\nend"
    line_tokens = LineTokens.of(text)
    assert line_tokens is not None
    cuts = [p for p in range(len(text) + 1) if line_tokens.is_cut(p)]
    assert [text[p : p + 3] for p in cuts] == ["Ann", "Bor", "[se", "end", ""]
    assert line_tokens.next_cut(0) == text.index("Boris")
    with pytest.raises(ValueError):
        line_tokens.count(1, 5)


WORDS = ["Anne:", "said", "it's", "fine.", "Really?!", "(yes)", "42", "naïve", "日本", "🙂", "-"]
BREAKS = [" ", " ", " ", "\n", "\n\n", "\n \n", "\n\n  ", "\r\n\r\n", "\t"]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    words=st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(BREAKS)), max_size=300),
    shape=st.sampled_from([(40, 0), (60, 10), (120, 30)]),
)
def test_chunks_counted_from_lines_as_encoded_whole(
    words: list[tuple[str, str]], shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunking with line tokens gives the chunks and counts of chunking that encodes."""
    text = "".join(word + gap for word, gap in words)
    chunk_size, overlap = shape
    with_lines = _chunks_counted(text, chunk_size, overlap)
    with monkeypatch.context() as patch:  # undone after each example
        patch.setattr(LineTokens, "of", classmethod(lambda cls, text: None))
        encoded = _chunks_counted(text, chunk_size, overlap)
    assert with_lines == encoded
    for chunk, count in zip(*with_lines, strict=True):
        assert count is None or count == len(encode(chunk))
