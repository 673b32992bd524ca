"""Line tokens: counts and ids of stretches of a text, against tiktoken's own encoding."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_dag.ingest.tokens import encode
from memory_dag.summaries.line_tokens import Counted, LineTokens
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


#: As many tokens as a stretch can hold: `count_and_last_ids` then gives them all.
EVERY = 10**9


def ids_of(line_tokens: LineTokens, start: int, end: int) -> list[int]:
    return line_tokens.count_and_last_ids(start, end, EVERY)[1]


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
        assert ids_of(line_tokens, start, end) == encode(text[start:end])
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


#: Line bodies whose ends meet the pre-tokenizer's cases: a letter, a digit, punctuation that
#: takes in the line breaks after it (with a space before it or not), a contraction, quotes,
#: and ends that are not ASCII (encoded, not taken from the count).
BODIES = [
    "Anne: hi",
    "Boris: it's 42",
    "Anne: fine.",
    "Boris: really?!",
    'Anne: he said "yes."',
    "Boris: well ...",
    "Anne: (sure)",
    "Boris: don't",
    "Anne: x !",
    "Boris: wow !!",
    "Anne: mail me @",
    'Boris: "no!"',
    "Boris: a  !",
    "Anne: naïve",
    "Boris: 日本。",
    "Anne: 🙂",
    "Boris: -",
    "Anne:\t-?",
    "?",
    "Anne: two\nlines.",  # a turn of two lines: a clean cut inside its counted stretch
    "Boris: gap\n  indented!",
]


def counted_lines() -> st.SearchStrategy[tuple[str, list[Counted]]]:
    """A text of lines (`BODIES` and a header), each followed by one or two line breaks, and
    the (start, end, tokens) of the bodies."""

    def build(parts: list[tuple[str, str, bool]]) -> tuple[str, list[Counted]]:
        text, counted = "", []
        for body, breaks, known in parts:
            if known:
                counted.append((len(text), len(text) + len(body), len(encode(body))))
            text += body + breaks
        return text, counted

    part = st.tuples(st.sampled_from(BODIES), st.sampled_from(["\n", "\n\n", ""]), st.booleans())
    return st.lists(part, max_size=40).map(build)


@settings(max_examples=300, deadline=None)
@given(counted_lines())
def test_counted_lines_give_the_counts_and_ids_of_encoding(
    built: tuple[str, list[Counted]],
) -> None:
    """Lines whose bodies were counted already give the same counts and ids as encoding."""
    text, counted = built
    line_tokens = LineTokens.of(text, counted)
    assert line_tokens is not None
    assert line_tokens.total() == len(encode(text))
    for start, end in spans(line_tokens)[:400]:
        ids = encode(text[start:end])
        assert line_tokens.count(start, end) == len(ids)
        assert ids_of(line_tokens, start, end) == ids
        for wanted in (0, 3, 50):
            count, last = line_tokens.count_and_last_ids(start, end, wanted)
            assert count == len(ids)
            assert last == (ids[max(0, len(ids) - wanted) :] if wanted else [])


def test_a_counted_line_is_not_encoded_again() -> None:
    """The count given for a line's body is the one used (a wrong one shows it); a body that
    ends in a character outside ASCII is encoded all the same."""
    anne, boris = "Anne: hello there.", "Boris: café"
    text = f"{anne}\n{boris}\n"
    wrong = [(0, len(anne), 100), (len(anne) + 1, len(text) - 1, 100)]
    line_tokens = LineTokens.of(text, wrong)
    assert line_tokens is not None
    breaks_add = len(encode(anne + "\n")) - len(encode(anne))
    assert line_tokens.count(0, len(anne) + 1) == 100 + breaks_add
    assert line_tokens.count(len(anne) + 1, len(text)) == len(encode(boris + "\n"))
    assert ids_of(line_tokens, 0, len(text)) == encode(text)  # ids are encoded when asked for


@settings(max_examples=100, deadline=None)
@given(counted_lines(), st.sampled_from([(40, 0), (60, 10), (120, 30)]))
def test_chunks_counted_from_counted_lines_as_from_encoded_ones(
    built: tuple[str, list[Counted]], shape: tuple[int, int]
) -> None:
    """Chunking with counted lines gives the chunks and counts of chunking without them."""
    text, counted = built
    chunk_size, overlap = shape
    with_counts = _chunks_counted(text, chunk_size, overlap, lines=LineTokens.of(text, counted))
    assert with_counts == _chunks_counted(text, chunk_size, overlap)
    for chunk, count in zip(*with_counts, strict=True):
        assert count is None or count == len(encode(chunk))
