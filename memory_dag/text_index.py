"""BM25 over chunk text with `bm25s` (sparse matrices: ~1 ms a query at 100k chunks).

One tokenizer serves both the corpus and the queries: lower-cased word tokens, English
stopwords removed, Snowball-stemmed. DuckDB's own FTS index is also built (for SQL users),
but at ~140 ms a query it is too slow for the search path.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from pathlib import Path

import bm25s
import numpy as np

logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")
# BM25 parameters (Lucene variant). b = 0.3 rather than the usual 0.75: chat turns vary in
# length for reasons unrelated to relevance; measured on LoCoMo, see docs/retrieval.md.
K1 = 1.2
B = 0.3


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=1)
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def tokenize(text: str) -> list[str]:
    """Words of `text` as BM25 terms (lower-case, no stopwords, stemmed)."""
    stop = _stopwords()
    words = [w for w in TOKEN_PATTERN.findall(text.lower()) if w not in stop]
    return _stemmer().stemWords(words)


def tokenize_many(texts: list[str]) -> list[list[str]]:
    """`tokenize` for a corpus: each distinct word is stemmed once."""
    stop = _stopwords()
    stem = _stemmer().stemWord
    stems: dict[str, str] = {}
    out: list[list[str]] = []
    for text in texts:
        terms = []
        for word in TOKEN_PATTERN.findall(text.lower()):
            if word in stop:
                continue
            term = stems.get(word)
            if term is None:
                term = stems[word] = stem(word)
            terms.append(term)
        out.append(terms)
    return out


class TextIndex:
    """A BM25 index whose document numbers are the rows of the published chunk table."""

    def __init__(self, retriever: bm25s.BM25, size: int) -> None:
        self.retriever = retriever
        self.size = size

    @classmethod
    def build(cls, texts: list[str]) -> TextIndex:
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        corpus_tokens = tokenize_many(texts)
        # bm25s cannot index an empty corpus or an all-empty one; keep a placeholder term.
        corpus_tokens = [tokens or ["\u2205"] for tokens in corpus_tokens]
        if corpus_tokens:
            retriever.index(corpus_tokens, show_progress=False)
        return cls(retriever, len(texts))

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        if self.size:
            self.retriever.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: Path, size: int) -> TextIndex:
        if size == 0:
            return cls(bm25s.BM25(), 0)
        retriever = bm25s.BM25.load(str(folder), mmap=False, show_progress=False)
        return cls(retriever, size)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every row for `query` (zeros where no term matches)."""
        if self.size == 0:
            return np.zeros(0, dtype=np.float32)
        vocab = self.retriever.vocab_dict
        ids = [vocab[t] for t in tokenize(query) if t in vocab]
        if not ids:
            return np.zeros(self.size, dtype=np.float32)
        return self.retriever.get_scores_from_ids(ids)
