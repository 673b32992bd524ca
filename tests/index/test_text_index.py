"""The BM25 index: the same scores as bm25s (the reference it replaced), one tokenizer for
documents and queries, and a file round trip."""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import polars as pl
import pytest

from memory_dag.index.text_index import TextIndex, tokenize, tokenize_corpus

DOCUMENTS = [
    "Caroline went to the LGBTQ support group yesterday and it was powerful.",
    "Melanie painted a sunset over the lake; painting relaxes her.",
    "The kids loved the pottery class. Pottery pottery pottery!",
    "Running runners ran: she runs every morning before work.",
    "A long document " + "about nothing in particular " * 30 + "with a sunset at the end.",
]
# Documents without a term: bm25s needs a placeholder term for them (which changes the mean
# length), so the comparison with it uses DOCUMENTS alone.
CORPUS = [*DOCUMENTS[:3], "", "the and of to", *DOCUMENTS[3:]]
QUERIES = [
    "what did Melanie paint",
    "pottery class kids",
    "sunset sunset",  # a repeated query term counts twice, as in bm25s
    "running",
    "nothing matches zyzzyva",
    "",
]

# Words are defined by Polars' regex (TOKEN_PATTERN); Python's `re` cuts them out of queries and
# of the documents' distinct pieces: they must agree in every script.
MULTILINGUAL = [
    "naïve café, Ünïcödé straße — résumé",
    "x_y foo-bar 3.14 I'm can't 1st 2nd",
    "中文字符 日本語のテキスト 한국어",
    "Ελληνικά кириллица עברית العربية हिन्दी",
    "emoji 🎉🎉 party, tabs\tand\nnewlines",
    "combining e\u0301 marks and \u00a0 nbsp",
]


def test_scores_equal_bm25s_lucene() -> None:
    index = TextIndex.build(DOCUMENTS)
    reference = bm25s.BM25(k1=1.2, b=0.3, method="lucene")
    reference.index([tokenize(text) for text in DOCUMENTS], show_progress=False)

    for query in QUERIES:
        ids = [reference.vocab_dict[t] for t in tokenize(query) if t in reference.vocab_dict]
        expected = reference.get_scores_from_ids(ids) if ids else np.zeros(len(DOCUMENTS))
        np.testing.assert_allclose(index.scores(query), expected, rtol=1e-5, err_msg=query)


def test_documents_without_terms_score_zero() -> None:
    scores = TextIndex.build(CORPUS).scores("sunset pottery paint")

    assert scores.shape == (len(CORPUS),)
    assert scores[3] == 0 and scores[4] == 0
    assert scores[1] > 0 and scores[2] > 0


def test_scores_rank_the_matching_document_first() -> None:
    index = TextIndex.build(CORPUS)

    assert int(np.argmax(index.scores("pottery class"))) == 2
    assert int(np.argmax(index.scores("painting"))) == 1
    assert int(np.argmax(index.scores("runner"))) == 5  # stemmed: painted/painting → paint
    assert not index.scores("zyzzyva").any()


@pytest.mark.parametrize("text", MULTILINGUAL + CORPUS)
def test_queries_and_documents_are_tokenized_alike(text: str) -> None:
    terms = tokenize_corpus([text])

    assert [terms.vocab[t] for t in terms.term_ids] == tokenize(text)


def test_python_word_pattern_equals_the_polars_definition() -> None:
    from memory_dag.index.text_index import TOKEN_PATTERN, _word_pattern

    by_polars = pl.Series(MULTILINGUAL).str.extract_all(TOKEN_PATTERN).to_list()

    assert by_polars == [_word_pattern().findall(text) for text in MULTILINGUAL]


def test_corpus_tokens_keep_their_documents() -> None:
    terms = tokenize_corpus(["", "cats and dogs", "the", "dogs"])

    pairs = list(zip(terms.doc_ids.tolist(), terms.term_ids.tolist(), strict=True))
    by_doc = [[terms.vocab[t] for d, t in pairs if d == i] for i in range(4)]
    assert by_doc == [[], ["cat", "dog"], [], ["dog"]]


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    index = TextIndex.build(CORPUS)
    index.save(tmp_path / "bm25")

    loaded = TextIndex.load(tmp_path / "bm25", len(CORPUS))

    for query in QUERIES:
        np.testing.assert_array_equal(loaded.scores(query), index.scores(query))


def test_empty_corpus(tmp_path: Path) -> None:
    index = TextIndex.build([])
    index.save(tmp_path / "bm25")

    loaded = TextIndex.load(tmp_path / "bm25", 0)

    assert loaded.scores("anything").shape == (0,)
