"""Which sources each chunk holds: found by bisection, as a scan of every source finds them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_dag.summaries.provenance import Content, chunk_sources


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.sampled_from(["", "a", "bb ", "ccc\n"]), st.booleans()), max_size=30
    ),
    cuts=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 40)), max_size=6),
)
def test_chunk_sources_are_the_sources_each_stretch_overlaps(
    parts: list[tuple[str, bool]], cuts: list[tuple[int, int]]
) -> None:
    built = Content()
    for number, (text, is_source) in enumerate(parts):
        built.add(text, f"s{number}" if is_source else None)
    content = "".join(built.parts)
    sources = tuple(built.sources)  # not stripped: the spans index `content` as built
    chunks = [content[start : start + length] for start, length in sorted(cuts)]
    expected = []
    position = 0
    for chunk in chunks:
        start = content.find(chunk, position)
        end = start + len(chunk)
        expected.append([s for s in sources if s.start < end and s.end > start])
        position = start
    assert chunk_sources(content, sources, chunks) == expected
