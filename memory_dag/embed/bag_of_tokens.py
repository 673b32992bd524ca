"""Token counts per text for WordLlama's tokenizer, tokenizing each distinct word once.

WordLlama embeds a text as the mean of its tokens' vectors, so all it needs from the
tokenizer is *how often each token occurs* in a text. Its tokenizer (Llama 2's SentencePiece
BPE: every " " becomes "▁", one "▁" is put in front, then BPE runs over the whole text as one
word) spends most of WordLlama's time re-merging the same words in every text.

No token of that vocabulary holds a "▁" after another character except runs of "▁▁…", so a
BPE merge never crosses a "▁" that follows a non-"▁" character: the text's tokens are exactly
the tokens of its space-separated words, each tokenized as "▁word". The counts are therefore
computed per distinct word (once per call) and summed per text with a sparse product. Texts
where that split is not exact (runs of spaces, a leading space, empty text, a special token
such as "<s>") go through the tokenizer whole. `tests/embed/test_embeddings.py` checks the vectors
equal WordLlama's own `embed`. Measured at 100k texts of ~190 tokens: 3 s against 33 s.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from memory_dag.ingest.pieces import number_pieces

if TYPE_CHECKING:
    from tokenizers import Tokenizer

WORD_MARK = "▁"
#: Below this many texts the whole-text tokenizer is faster than setting up the word split
#: (a search query: ~0.05 ms against ~2 ms).
WORD_SPLIT_MIN_TEXTS = 256
#: Distinct words whose token ids are remembered between calls (~100 bytes each).
WORD_CACHE_SIZE = 500_000
#: A call's texts are counted in slices of this many, one thread a core at a time: Polars,
#: the tokenizer and SciPy's product let go of the GIL (100k texts: 2.1 s → 1.2 s on 2
#: cores). Each text's row comes from its slice (which numbers its words, and so orders each
#: row's sum, in its own way): slices of a fixed size keep a call's vectors the same bit for
#: bit on any number of cores (a shard's worker held to one core, a laptop with eight).
SLICE_TEXTS = 2_048


class BagOfTokens:
    """`counts(texts)`: a (texts × vocabulary) sparse matrix of token counts."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        split_min_texts: int = WORD_SPLIT_MIN_TEXTS,
        threads: int | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        from memory_dag.embed.onnx_models import usable_cpus

        # The tokenizer as JSON, once: each copy below is made from it (~0.05 s to write,
        # ~0.15 s to read back, for Llama 2's vocabulary).
        self._spec_text = tokenizer.to_str()
        spec = json.loads(self._spec_text)
        if not _word_separable(spec):
            raise ValueError("tokenizer is not a SentencePiece-style BPE over '▁'-joined words")
        self.vocab_size = vocab_size
        self.split_min_texts = split_min_texts
        # The whole-text tokenizer, for the texts the word split does not cover exactly.
        self._whole = Tokenizer.from_str(self._spec_text)
        self._whole.no_padding()
        self._whole.no_truncation()
        # The word tokenizer, made on the first word split (a query never needs it).
        self._words_tokenizer: Tokenizer | None = None
        # Special tokens ("<s>", ...) are cut out of the raw text before normalising.
        self._word_cache: dict[str, list[int]] = {}
        self._word_cache_lock = threading.Lock()  # threads of one call share the cache
        self.threads = usable_cpus() if threads is None else max(1, threads)
        self._specials = [t["content"] for t in spec.get("added_tokens") or []]

    def counts(self, texts: Sequence[str]) -> sp.csr_matrix:
        if len(texts) < self.split_min_texts:
            return self._whole_counts(list(texts))
        series = pl.Series("text", list(texts), dtype=pl.String)
        whole = (
            series.str.contains("  ", literal=True)
            | series.str.starts_with(" ")
            | (series.str.len_bytes() == 0)
            | series.str.contains_any(self._specials)
        ).to_numpy()
        matrix = self._split_counts(series.filter(~pl.Series(whole)))
        if not whole.any():
            return matrix
        rows = np.flatnonzero(whole)
        exact = self._whole_counts([texts[i] for i in rows])
        out = sp.vstack([matrix, exact], format="csr")
        # vstack put the split rows first, then the whole ones: restore input order.
        order = np.concatenate([np.flatnonzero(~whole), rows])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return out[inverse]

    def _split_counts(self, series: pl.Series) -> sp.csr_matrix:
        if series.is_empty():
            return sp.csr_matrix((0, self.vocab_size), dtype=np.float32)
        words = number_pieces(series.str.split(" "))
        texts_by_words = _csr(words.codes, words.per_text, len(words.distinct))
        words_by_tokens = _csr_from_ids(self._word_ids(words.distinct.to_list()), self.vocab_size)
        return (texts_by_words @ words_by_tokens).tocsr()

    def _word_ids(self, words: list[str]) -> list[list[int]]:
        """Token ids of each word, remembered across calls (an ingest embeds in batches)."""
        cache = self._word_cache
        with self._word_cache_lock:
            missing = [word for word in words if word not in cache]
            if missing:
                if len(cache) + len(missing) > WORD_CACHE_SIZE:
                    cache.clear()
                    missing = words
                encoded = self._words().encode_batch_fast(
                    [WORD_MARK + word for word in missing], add_special_tokens=False
                )
                cache.update(zip(missing, (e.ids for e in encoded), strict=True))
            return [cache[word] for word in words]

    def _words(self) -> Tokenizer:
        """The word tokenizer: gets "▁word" already normalised (no normaliser, no padding).
        Called under the word cache's lock."""
        if self._words_tokenizer is None:
            from tokenizers import Tokenizer

            words = Tokenizer.from_str(self._spec_text)
            words.no_padding()
            words.no_truncation()
            words.normalizer = None
            self._words_tokenizer = words
        return self._words_tokenizer

    def token_sums(self, texts: Sequence[str], vectors: np.ndarray) -> np.ndarray:
        """Sum of each text's token rows of `vectors`: `counts(texts) @ vectors`.

        A search query or a few texts index the rows directly (~0.05 ms a text, where
        building a sparse matrix costs ~0.15 ms before any arithmetic).
        """
        if len(texts) >= self.split_min_texts:

            def sums_of(rows: slice) -> np.ndarray:
                return np.asarray(self.counts(texts[rows]) @ vectors)

            slices = [slice(at, at + SLICE_TEXTS) for at in range(0, len(texts), SLICE_TEXTS)]
            if len(slices) == 1 or self.threads == 1:
                return np.vstack([sums_of(rows) for rows in slices])
            # Threads for this call only (starting two costs ~0.1 ms): none outlives it, so a
            # command that embedded still leaves without waiting on idle workers.
            with ThreadPoolExecutor(self.threads, thread_name_prefix="bag-of-tokens") as pool:
                return np.vstack(list(pool.map(sums_of, slices)))
        encoded = self._whole.encode_batch_fast(list(texts), add_special_tokens=False)
        out = np.zeros((len(encoded), vectors.shape[1]), dtype=np.float32)
        for row, tokens in enumerate(encoded):
            if tokens.ids:
                out[row] = vectors[np.clip(tokens.ids, 0, self.vocab_size - 1)].sum(axis=0)
        return out

    def _whole_counts(self, texts: list[str]) -> sp.csr_matrix:
        encoded = self._whole.encode_batch_fast(texts, add_special_tokens=False)
        return _csr_from_ids([e.ids for e in encoded], self.vocab_size)


def is_word_separable(tokenizer: Tokenizer) -> bool:
    """True for the SentencePiece-as-BPE layout the word split is exact for (see module doc)."""
    return _word_separable(json.loads(tokenizer.to_str()))


def _word_separable(spec: dict[str, Any]) -> bool:
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or spec.get("pre_tokenizer"):
        return False
    steps = (spec.get("normalizer") or {}).get("normalizers") or []
    expected = [
        {"type": "Prepend", "prepend": WORD_MARK},
        {"type": "Replace", "pattern": {"String": " "}, "content": WORD_MARK},
    ]
    if steps != expected:
        return False
    # A "▁" after another character would let a merge cross a word boundary.
    return not any(WORD_MARK in token.lstrip(WORD_MARK) for token in model.get("vocab", {}))


def _csr(columns: np.ndarray, row_lengths: np.ndarray, width: int) -> sp.csr_matrix:
    indptr = np.zeros(len(row_lengths) + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=indptr[1:])
    data = np.ones(len(columns), dtype=np.float32)
    # Repeated columns in a row are fine: scipy's products add them up.
    return sp.csr_matrix(
        (data, columns.astype(np.int32, copy=False), indptr), shape=(len(row_lengths), width)
    )


def _csr_from_ids(ids: list[list[int]], width: int) -> sp.csr_matrix:
    lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter((i for row in ids for i in row), dtype=np.int64, count=int(lengths.sum()))
    # WordLlama clips out-of-range ids to the last row; do the same.
    np.clip(flat, 0, width - 1, out=flat)
    return _csr(flat, lengths, width)
