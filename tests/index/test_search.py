"""Hybrid search over the published index: filters inside the query, result fields, scores,
and reads that do not depend on the DuckDB file being free."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memory_dag.config import Settings
from memory_dag.index.published import publish_index
from memory_dag.index.search import SNIPPET_CHARS, Searcher, SearchFilters, search
from memory_dag.pipeline import run_first_stages
from tests.store.test_store import hold_lock


@pytest.fixture
def built(settings: Settings) -> Settings:
    run_first_stages(settings)
    return settings


def test_finds_the_turn_and_reports_where_it_came_from(built: Settings) -> None:
    hits = search("what is the name of the cat", settings=built, k=3, min_score=0.0)
    top = hits[0]
    assert top.turn_ids == ["t1"]
    assert top.path == "sessions/conv-a/s1.jsonl"
    assert (top.start_line, top.end_line) == (1, 1)
    assert (top.conversation_id, top.session_id) == ("conv-a", "s1")
    assert top.kind == "transcript" and top.source == "sessions"
    assert "Miso" in top.snippet
    assert top.event_time is not None and top.event_time.year == 2026
    assert hits == sorted(hits, key=lambda h: -h.score)


def test_filters_restrict_candidates_before_ranking(built: Settings) -> None:
    everything = search("tea coffee cat trip", settings=built, k=20, min_score=0.0)
    assert {h.conversation_id for h in everything} >= {"conv-a", "conv-b", None}

    scoped = search("tea coffee", settings=built, k=20, min_score=0.0, conversation="conv-a")
    assert scoped and all(h.conversation_id == "conv-a" for h in scoped)

    session = search("cat", settings=built, k=20, min_score=0.0, session="s2")
    assert session and all(h.session_id == "s2" for h in session)

    notes = search("cat", settings=built, k=20, min_score=0.0, source="memory")
    assert notes and all(h.source == "memory" for h in notes)

    folder = search("tomatoes", settings=built, k=20, min_score=0.0, path="memory/")
    assert [h.path for h in folder] == ["memory/garden.md"]

    assert search("cat", settings=built, conversation="no-such", min_score=0.0) == []


def test_min_score_and_k_bound_the_results(built: Settings) -> None:
    loose = search("Miso the cat", settings=built, k=50, min_score=0.0)
    assert len(loose) == 9  # all 9 chunks of the store (3 notes, 6 turns) at k=50
    strict = search("Miso the cat", settings=built, k=50, min_score=0.6)
    assert strict and all(h.score >= 0.6 for h in strict) and len(strict) < len(loose)
    assert len(search("Miso the cat", settings=built, k=2, min_score=0.0)) == 2


def test_rrf_fusion_is_available_and_ranks_the_exact_match_first(built: Settings) -> None:
    hits = search("Priya Toronto sister", settings=built, k=3, min_score=0.0, fusion="rrf")
    assert hits[0].turn_ids == ["t3"]
    assert 0.0 < hits[-1].score <= hits[0].score <= 1.0


def test_blend_weights_vector_and_text_scores(tmp_path: Path) -> None:
    """Hand-made index: blended score = (0.7·cosine + 0.3·bm25/max_bm25) / 1.0."""
    import pyarrow as pa

    texts = ["alpha beta", "gamma delta", "alpha alpha alpha"]
    vectors = np.eye(3, 256, dtype=np.float32)
    rows = pa.table(
        {
            "id": ["a", "b", "c"],
            "kind": ["note"] * 3,
            "source": ["memory"] * 3,
            "path": ["x.md"] * 3,
            "start_line": [1, 2, 3],
            "end_line": [1, 2, 3],
            "text": texts,
            "search_text": texts,
            "speaker": [None] * 3,
            "turn_ids": [[], [], []],
            "conversation_id": [None] * 3,
            "session_id": [None] * 3,
            "event_time": [None] * 3,
        }
    )
    publish_index(
        tmp_path, rows, vectors, provider="wordllama", model="l2_supercat_256", fingerprint="x"
    )
    searcher = Searcher(Settings(index_dir=tmp_path, vector_weight=0.7, text_weight=0.3))
    query_vector = searcher.provider.embed(["alpha"])[0]
    hits = searcher.search("alpha", k=3, min_score=0.0, fusion="blend")
    bm25 = searcher.index.text.scores("alpha")
    for hit in hits:
        row = ["a", "b", "c"].index(hit.id)
        cosine = max(0.0, float(query_vector[row]))
        expected = 0.7 * cosine + 0.3 * bm25[row] / bm25.max()
        assert hit.score == pytest.approx(expected, abs=1e-5)


def test_snippets_are_capped(settings: Settings, workspace: Path) -> None:
    (workspace / "memory" / "long.md").write_text("word " * 1500)
    run_first_stages(settings)
    hits = search("word", settings=settings, k=10, min_score=0.0, path="memory/long.md")
    assert hits and all(len(h.snippet) <= SNIPPET_CHARS for h in hits)


def test_a_hits_whole_text_is_its_snippet_or_its_row(settings: Settings, workspace: Path) -> None:
    """`text_of` answers from the snippet when it was not cut, else from the published row."""
    texts = {
        "short.md": "zebra short note",
        "exact.md": ("zebra " * 200)[: SNIPPET_CHARS - 1].strip() + "x",
        "long.md": "zebra " + "long words here " * 100,
    }
    for name, text in texts.items():
        (workspace / "memory" / name).write_text(text)
    run_first_stages(settings)
    searcher = Searcher(settings)
    hits = searcher.search("zebra", k=50, min_score=0.0, filters=SearchFilters(kind="note"))
    by_path = {hit.path: hit for hit in hits if hit.path in {f"memory/{n}" for n in texts}}
    assert set(by_path) == {f"memory/{n}" for n in texts}
    for name in texts:
        hit = by_path[f"memory/{name}"]
        assert searcher.text_of(hit).startswith(hit.snippet)
    assert searcher.text_of(by_path["memory/short.md"]) == "zebra short note"
    long_hit = by_path["memory/long.md"]
    assert len(long_hit.snippet) == SNIPPET_CHARS  # cut: the whole text is the row's
    assert searcher.text_of(long_hit).split() == texts["long.md"].split()


def test_search_works_while_another_process_writes_the_store(built: Settings) -> None:
    holder = hold_lock(built.db_path, 3)
    try:
        searcher = Searcher(built)
        hits = searcher.search("Priya", k=1, min_score=0.0, filters=SearchFilters())
        assert hits[0].turn_ids == ["t3"]
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipes


def test_search_before_any_ingest_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="memory-dag ingest"):
        search("x", settings=Settings(index_dir=tmp_path / "none"))


def test_a_repeated_query_reuses_its_scores_and_answers_the_same(built: Settings) -> None:
    searcher = Searcher(built)
    fresh = [(h.id, h.score) for h in searcher.search("name of the cat", k=5, min_score=0.0)]
    kept = searcher._bm25_cache[("name of the cat", None)]
    vector = searcher._vector_cache["name of the cat"]
    again = searcher.search(
        "name of the cat", k=5, min_score=0.0, filters=SearchFilters(conversation="conv-a")
    )
    assert searcher._bm25_cache[("name of the cat", None)] is kept  # computed once
    assert searcher._vector_cache["name of the cat"] is vector  # embedded once, for both
    assert not kept.flags.writeable  # no search can change what the next one reads
    assert [(h.id, h.score) for h in searcher.search("name of the cat", k=5, min_score=0.0)] == (
        fresh
    )
    assert {h.conversation_id for h in again} == {"conv-a"}
    for n in range(20):  # bounded
        searcher.search(f"query {n}", k=1)
    assert len(searcher._bm25_cache) <= 8 and len(searcher._vector_cache) <= 8


QUERIES = ("name of the cat", "tea coffee", "trip", "cat", "what did they drink")


def test_a_block_of_rows_is_scored_as_the_whole_index_scores_it(built: Settings) -> None:
    """A conversation's BM25 scores, computed from its block of rows alone, are the whole
    index's scores there, value for value, and zero elsewhere."""
    index = Searcher(built).index
    text = index.text
    assert len(index.rows_by_conversation) >= 2
    for rows in index.rows_by_conversation.values():
        first, last = int(rows[0]), int(rows[-1])
        assert last - first + 1 == len(rows)  # a conversation is one block
        for query in QUERIES:
            whole, part = text.scores(query), text.scores(query, (first, last))
            assert np.array_equal(part[first : last + 1], whole[first : last + 1])
            assert not part[:first].any() and not part[last + 1 :].any()
    assert any(text.scores(query).any() for query in QUERIES)  # the queries match something


def test_a_conversation_search_reads_no_score_outside_its_block(built: Settings) -> None:
    """The same hits and scores as with every row's BM25 scores at hand."""
    scoped, whole = Searcher(built), Searcher(built)
    for conversation in ("conv-a", "conv-b"):
        for query in QUERIES:
            rows = scoped.index.rows_by_conversation[conversation]
            block = (int(rows[0]), int(rows[-1]))
            filters = SearchFilters(conversation=conversation)
            hits = scoped.search(query, k=5, min_score=0.0, filters=filters)
            assert (query, block) in scoped._bm25_cache  # the block alone was scored
            whole._bm25_cache[(query, block)] = whole.index.text.scores(query)
            expected = whole.search(query, k=5, min_score=0.0, filters=filters)
            assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in expected]
