"""Token counts of large batches (cut into pieces by Polars) equal tiktoken's, text by text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from memory_dag.ingest import tokens
from memory_dag.ingest.tokens import PIECES_MIN_TEXTS, count_tokens_batch, get_encoding

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "locomo-dev"

# Characters the cl100k pieces treat differently: letters (ASCII, accented, Greek, CJK),
# digits (ASCII and others), apostrophes and contractions, punctuation, symbols, emoji,
# combining marks, a zero-width joiner, control characters and every kind of whitespace.
ALPHABET = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    + list("0123456789٣४")
    + list("'’\"`")
    + list(".,;:!?-_()[]{}<>/\\|@#$%^&*+=~")
    + list("éüßñçÆøŁΩλжЖ中文字日本한")
    + ["🎉", "👍🏽", "\u0301", "\u200d", "\x00", "\x1f"]
    + [" ", " ", " ", " ", "\t", "\n", "\r", "\u00a0", "\u2003", "\u3000"]
)
FRAGMENTS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "123456", "  ", " \n"]


def random_text(rng: random.Random) -> str:
    parts = [
        rng.choice(FRAGMENTS) if rng.random() < 0.1 else rng.choice(ALPHABET)
        for _ in range(rng.randint(0, 60))
    ]
    return "".join(parts)


def single_spaced(text: str) -> str:
    return " ".join(text.split())


def tiktoken_counts(texts: list[str]) -> list[int]:
    encoding = get_encoding()
    assert encoding is not None
    return [len(encoding.encode_ordinary(text)) for text in texts]


def test_random_texts_count_as_tiktoken_counts_them() -> None:
    rng = random.Random(7)
    texts = [random_text(rng) for _ in range(4 * PIECES_MIN_TEXTS)]
    # Half of them single-spaced, so that both the piece path and the whole path are used.
    texts = [single_spaced(t) if i % 2 else t for i, t in enumerate(texts)]
    texts += ["", " ", "a ", " a", "'s", "x" * 500, "1234567 89", "don't stop!!! ok"]

    assert count_tokens_batch(texts) == tiktoken_counts(texts)


def test_single_spaced_texts_are_counted_by_pieces() -> None:
    """The fast path really runs (a test that only met the fallback would prove nothing)."""
    encoding = get_encoding()
    assert encoding is not None
    rng = random.Random(11)
    texts = [single_spaced(random_text(rng)) for _ in range(PIECES_MIN_TEXTS)]
    texts.append("two  spaces")

    counts = tokens._count_by_pieces(texts, encoding)

    assert (counts[:-1] >= 0).all() and counts[-1] == -1
    assert counts[:-1].tolist() == tiktoken_counts(texts[:-1])


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo dev set not found beside the checkout")
def test_real_turns_count_as_tiktoken_counts_them() -> None:
    texts: list[str] = []
    for path in sorted(LOCOMO.glob("*.json")):
        conversation = json.loads(path.read_text())
        conversation = conversation.get("conversation", conversation)
        for key, turns in conversation.items():
            if key.startswith("session_") and isinstance(turns, list):
                texts += [f"{turn['speaker']}: {turn['text']}" for turn in turns]
    assert len(texts) >= PIECES_MIN_TEXTS

    assert count_tokens_batch(texts) == tiktoken_counts(texts)
