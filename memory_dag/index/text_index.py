"""BM25 over chunk text as one sparse matrix (term → documents): ~1 ms a query at 100k chunks.

One tokenizer serves both the corpus and the queries: lower-cased word tokens, English
stopwords removed, Snowball-stemmed. The corpus is cut at spaces by Polars and each distinct
piece is tokenized once, and the BM25 weights are computed as arrays: building the index
for 100k chunks takes ~3 s (bm25s, which this replaced, took ~13 s with its Python
tokenizer). The scores are bm25s's Lucene variant exactly (checked in tests). DuckDB's own
FTS index is also built (for SQL users), but at ~140 ms a query it is too slow for the
search path.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from memory_dag.ingest.pieces import number_pieces

#: Words: maximal runs of two or more word characters (Unicode `\w` as Rust's regex defines it).
TOKEN_PATTERN = r"\b\w\w+\b"
# BM25 parameters (Lucene variant). b = 0.3 rather than the usual 0.75: chat turns vary in
# length for reasons unrelated to relevance; measured on LoCoMo, see docs/retrieval.md.
K1 = 1.2
B = 0.3


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


@dataclass
class Terms:
    """A tokenized corpus: `term_ids[i]` is a term of document `doc_ids[i]`; `vocab[t]` its text."""

    doc_ids: np.ndarray
    term_ids: np.ndarray
    vocab: list[str]


#: Texts tokenized together: the pieces of a batch are held at once (~1 GB for 100k texts
#: would be ~10 GB for 1M), so a large corpus goes through in batches of this size.
TOKENIZE_BATCH = 100_000


#: (term, document) pairs weighted at a time by `TextIndex.from_batches`.
WEIGHT_BLOCK = 4_000_000


def _concatenated(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """The parts as one array, emptying the list as it goes (no part is held twice)."""
    out = np.empty(sum(len(part) for part in parts), dtype=dtype)
    at = 0
    while parts:
        part = parts.pop(0)
        out[at : at + len(part)] = part
        at += len(part)
    return out


def tokenize_corpus(texts: Sequence[str] | pl.Series) -> Terms:
    """BM25 terms of every text (lower-case, no stopwords, stemmed), in document order.

    Texts are cut at spaces by Polars; each distinct piece ("word", "word,", "it's") is
    then tokenized and stemmed once, in Python, exactly as `tokenize` does for a query.
    A word never spans a space, so that is the same as tokenizing every text whole, and
    a corpus repeats its pieces so much that this is ~2x faster than a regex per text.
    Terms are numbered in the order they first occur, batch after batch.
    """
    series = texts if isinstance(texts, pl.Series) else pl.Series("text", list(texts), pl.String)
    vocab_index: dict[str, int] = {}
    terms_of_piece: dict[str, list[int]] = {}
    doc_ids: list[np.ndarray] = []
    term_ids: list[np.ndarray] = []
    for start in range(0, max(len(series), 1), TOKENIZE_BATCH):
        batch = series.slice(start, TOKENIZE_BATCH)
        docs, terms = _tokenize_batch(batch, vocab_index, terms_of_piece)
        doc_ids.append(docs + start)
        term_ids.append(terms)
    return Terms(np.concatenate(doc_ids), np.concatenate(term_ids), list(vocab_index))


def _tokenize_batch(
    texts: pl.Series, vocab_index: dict[str, int], terms_of_piece: dict[str, list[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """(document, term) pairs of one batch; new pieces and terms join the two mappings."""
    pieces = number_pieces(texts.fill_null("").str.split(" "))
    # Terms of each distinct piece, as a ragged array: piece p has terms[starts[p]:starts[p+1]].
    find_words = _word_pattern().findall
    piece_terms = []
    for piece in pieces.distinct.to_list():
        terms = terms_of_piece.get(piece)
        if terms is None:
            terms = terms_of_piece[piece] = [
                vocab_index.setdefault(term, len(vocab_index))
                for term in _terms_of_words(find_words(piece))
                if term is not None
            ]
        piece_terms.append(terms)
    lengths = np.fromiter(map(len, piece_terms), dtype=np.int32, count=len(piece_terms))
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    all_terms = np.fromiter(
        (t for terms in piece_terms for t in terms), dtype=np.int32, count=int(starts[-1])
    )
    # Every occurrence of a piece gives its document that piece's terms. Stopwords and
    # punctuation (no terms) are dropped first: they are about half of all pieces.
    occurrence_terms = lengths[pieces.codes]
    kept = occurrence_terms > 0
    piece_code, occurrence_terms = pieces.codes[kept], occurrence_terms[kept]
    doc_ids = np.repeat(pieces.text_of_each()[kept], occurrence_terms)
    output_start = np.cumsum(occurrence_terms, dtype=np.int64) - occurrence_terms
    offset = np.repeat(starts[:-1][piece_code] - output_start, occurrence_terms)
    term_ids = all_terms[offset + np.arange(len(doc_ids), dtype=np.int64)]
    return doc_ids, term_ids


def tokenize(text: str) -> list[str]:
    r"""The BM25 terms of one query, as `tokenize_corpus` would make them.

    Plain Python (~20 µs; a Polars call costs ~0.3 ms), with a character class built from
    Polars' own `\w`, so that queries and documents split words identically in every script.
    """
    return [t for t in _terms_of_words(_word_pattern().findall(text)) if t is not None]


def _terms_of_words(words: list[str]) -> list[str | None]:
    """Lower-case and stem each word; None for stopwords."""
    stop = _stopwords()
    lowered = [word.lower() for word in words]
    stems = _stemmer().stemWords(lowered)
    return [None if low in stop else stem for low, stem in zip(lowered, stems, strict=True)]


@lru_cache(maxsize=1)
def _word_pattern() -> re.Pattern[str]:
    r"""Python twin of TOKEN_PATTERN: `[<every character Polars calls \w>]{2,}` (~0.1 s once).

    Python's own `\w` differs from Rust's (combining marks, newer Unicode), and a greedy run
    of two or more word characters is exactly what `\b\w\w+\b` matches. Every code point but
    the surrogates is decoded from one UTF-32 buffer (a `chr` per code point took 0.2 s).
    """
    code_points = np.concatenate(
        [np.arange(0xD800, dtype="<u4"), np.arange(0xE000, sys.maxunicode + 1, dtype="<u4")]
    )
    every_char = code_points.tobytes().decode("utf-32-le")
    word_chars = pl.Series([every_char]).str.extract_all(r"\w").to_list()[0]
    codes = sorted(ord(c) for c in word_chars)
    ranges: list[str] = []
    start = previous = codes[0]
    for code in [*codes[1:], -1]:
        if code != previous + 1:
            first, last = re.escape(chr(start)), re.escape(chr(previous))
            ranges.append(first if start == previous else f"{first}-{last}")
            start = code
        previous = code
    return re.compile(f"[{''.join(ranges)}]{{2,}}")


class TextIndex:
    """BM25 weights in CSC layout: term t's documents are `docs[indptr[t]:indptr[t + 1]]`.

    Document numbers are the rows of the published chunk table.
    """

    def __init__(
        self,
        vocab: dict[str, int],
        indptr: np.ndarray,
        docs: np.ndarray,
        weights: np.ndarray,
        size: int,
        avg_length: float | None = None,
    ) -> None:
        self.vocab = vocab
        self.indptr = indptr
        self.docs = docs
        self.weights = weights
        self.size = size
        #: Mean document length in terms (known when built; the manifest keeps it).
        self.avg_length = avg_length

    @classmethod
    def build(cls, texts: Sequence[str] | pl.Series) -> TextIndex:
        series = (
            texts if isinstance(texts, pl.Series) else pl.Series("text", list(texts), pl.String)
        )
        batches = (
            series.slice(start, TOKENIZE_BATCH) for start in range(0, len(series), TOKENIZE_BATCH)
        )
        return cls.from_batches(batches, len(series))

    @classmethod
    def from_batches(cls, batches: Iterable[pl.Series], size: int) -> TextIndex:
        """The index of `size` documents that come in batches (in row order), so that a large
        corpus is never held whole, nor its tokens: each batch is reduced at once to its
        distinct (document, term) pairs and their counts, ~8 bytes a pair, then the pairs of
        every batch are turned term-major in one counting pass."""
        vocab_index: dict[str, int] = {}
        terms_of_piece: dict[str, list[int]] = {}
        # Document-major: document d's terms are terms[indptr[d]:indptr[d + 1]].
        indptr_parts = [np.zeros(1, dtype=np.int64)]
        term_parts: list[np.ndarray] = []
        tf_parts: list[np.ndarray] = []
        length_parts: list[np.ndarray] = []
        done = pairs = 0
        for batch in batches:
            docs, terms = _tokenize_batch(batch, vocab_index, terms_of_piece)
            by_doc = sp.csr_matrix(
                (np.ones(len(docs), dtype=np.float32), (docs, terms)),
                shape=(len(batch), max(len(vocab_index), 1)),
            )
            by_doc.sum_duplicates()
            indptr_parts.append(by_doc.indptr[1:].astype(np.int64) + pairs)
            term_parts.append(by_doc.indices.astype(np.int32))
            tf_parts.append(by_doc.data)
            length_parts.append(np.bincount(docs, minlength=len(batch)).astype(np.float32))
            done += len(batch)
            pairs += by_doc.nnz
            del docs, terms, by_doc
        if done != size:
            raise ValueError(f"{done} documents came in batches, not {size}")
        n_terms = len(vocab_index)
        by_doc = sp.csr_matrix(
            (
                _concatenated(tf_parts, np.float32),
                _concatenated(term_parts, np.int32),
                np.concatenate(indptr_parts),
            ),
            shape=(size, n_terms),
        )
        # Term-major, each term's documents in ascending order (a counting transpose).
        by_term = by_doc.tocsc()
        del by_doc
        indptr = by_term.indptr.astype(np.int64)
        doc_of = by_term.indices.astype(np.int32, copy=False)
        weights = by_term.data
        del by_term
        doc_length = _concatenated(length_parts, np.float32)
        avg_length = max(float(doc_length.mean()), 1e-9) if size else 1.0
        doc_freq = np.diff(indptr)
        idf = np.log1p((size - doc_freq + 0.5) / (doc_freq + 0.5)).astype(np.float32)
        # tf → BM25 weight in place, a block of pairs at a time (the temporaries stay small).
        k_fixed, k_length = np.float32(K1 * (1.0 - B)), np.float32(K1 * B / avg_length)
        for start in range(0, len(weights), WEIGHT_BLOCK):
            end = min(start + WEIGHT_BLOCK, len(weights))
            term_of = np.searchsorted(indptr, np.arange(start, end), side="right") - 1
            tf = weights[start:end]
            norm = k_fixed + k_length * doc_length[doc_of[start:end]]
            weights[start:end] = idf[term_of] * tf / (tf + norm)
        vocab = {term: i for i, term in enumerate(vocab_index)}
        return cls(vocab, indptr, doc_of, weights, size, avg_length)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vocab.json").write_text(json.dumps(list(self.vocab), ensure_ascii=False))
        np.save(folder / "indptr.npy", self.indptr)
        np.save(folder / "docs.npy", self.docs)
        np.save(folder / "weights.npy", self.weights)

    @classmethod
    def load(cls, folder: Path, size: int, *, mapped: bool = False) -> TextIndex:
        """The postings saved in `folder`; `mapped`: the two large arrays memory-mapped (read
        only, paged in as queries touch their terms), for readers."""
        terms = json.loads((folder / "vocab.json").read_text())
        mode = "r" if mapped else None
        return cls(
            {term: i for i, term in enumerate(terms)},
            np.load(folder / "indptr.npy"),
            np.asarray(np.load(folder / "docs.npy", mmap_mode=mode)),
            np.asarray(np.load(folder / "weights.npy", mmap_mode=mode)),
            size,
        )

    def document_frequency(self, term: str) -> int:
        """How many documents hold `term` (0 when the vocabulary lacks it)."""
        position = self.vocab.get(term)
        if position is None:
            return 0
        return int(self.indptr[position + 1] - self.indptr[position])

    def scores(self, query: str, block: tuple[int, int] | None = None) -> np.ndarray:
        """BM25 score of every row for `query` (zeros where no term matches).

        A term the query repeats counts once per repetition, as in bm25s. `block` (first,
        last): only the scores of those rows, the others left zero; each term's postings are
        in row order, so its rows in the block are one run, found by bisection (a
        conversation at 1M rows: ~2 ms instead of ~6), with the same sums as the whole.
        """
        ids = [self.vocab[t] for t in tokenize(query) if t in self.vocab]
        scores = np.zeros(self.size, dtype=np.float32)
        if not ids or self.size == 0:
            return scores
        for term in ids:  # np.add.at: ~2x faster than `scores[docs] += weights` here
            start, end = int(self.indptr[term]), int(self.indptr[term + 1])
            if block is not None:
                low, high = np.searchsorted(self.docs[start:end], (block[0], block[1] + 1))
                start, end = start + int(low), start + int(high)
            np.add.at(scores, self.docs[start:end], self.weights[start:end])
        return scores
