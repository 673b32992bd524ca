"""Texts cut into pieces, each distinct piece numbered once: what makes the tokenizers fast.

Text repeats its words endlessly, so the three tokenizers of an ingest (cl100k token counts
in `tokens.py`, WordLlama's bag of tokens in `bag_of_tokens.py`, BM25 terms in
`text_index.py`) cut all texts into pieces in Polars, handle each *distinct* piece once in
Python, and add the results up per text with array operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(frozen=True)
class NumberedPieces:
    """Every piece occurrence, in text order, as the number of its distinct piece."""

    #: Each distinct piece once; piece number i is `distinct[i]`.
    distinct: pl.Series
    #: For each occurrence, the number of its piece.
    codes: np.ndarray
    #: How many occurrences each text has.
    per_text: np.ndarray

    def text_of_each(self) -> np.ndarray:
        """For each occurrence, the row of its text."""
        return np.repeat(np.arange(len(self.per_text), dtype=np.int64), self.per_text)


def number_pieces(pieces: pl.Series) -> NumberedPieces:
    """Number the pieces of a list-of-strings column (one list per text, possibly empty)."""
    per_text = pieces.list.len().fill_null(0).to_numpy()
    flat = pieces.explode().drop_nulls()  # an empty list explodes to one null
    distinct = flat.unique(maintain_order=True)
    codes = flat.cast(pl.Enum(distinct)).to_physical().to_numpy()
    return NumberedPieces(distinct=distinct, codes=codes, per_text=per_text)
