"""Cross-encoder reranker against a tiny ONNX graph whose logits are computed by hand."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from memory_dag.embed.onnx_models import OnnxModelError
from memory_dag.read.rerank import CrossEncoderReranker, load_reranker, sigmoid
from tests.onnx_fixtures import build_cross_encoder, build_embedding_model

QUERY = "the cat"
# Different lengths, not sorted, so batches pad and rows must be put back in order.
PASSAGES = [
    "a bird sang loud far far far",
    "sat on the mat",
    "dog",
    "zebra ran far on the mat",
    "the cat sat",
]


def test_scores_are_sigmoid_of_hand_computed_logits(tmp_path: Path) -> None:
    model = build_cross_encoder(tmp_path)
    reranker = CrossEncoderReranker(tmp_path, batch_size=2)

    scores = reranker.score(QUERY, PASSAGES)

    logits = np.array([model.expected_logit(QUERY, p) for p in PASSAGES])
    assert scores.dtype == np.float32
    assert scores.shape == (len(PASSAGES),)
    np.testing.assert_allclose(scores, 1.0 / (1.0 + np.exp(-logits)), rtol=1e-5)


def test_query_and_passage_are_distinct_segments(tmp_path: Path) -> None:
    """Pair encoding gives the passage segment 1; swapping roles changes the score."""
    model = build_cross_encoder(tmp_path)
    reranker = CrossEncoderReranker(tmp_path)

    forward = reranker.score("dog ran", ["the cat sat on the mat"])[0]
    swapped = reranker.score("the cat sat on the mat", ["dog ran"])[0]

    assert forward != pytest.approx(swapped, abs=1e-4)
    expected = 1.0 / (1.0 + np.exp(-model.expected_logit("dog ran", "the cat sat on the mat")))
    assert forward == pytest.approx(expected, rel=1e-5)


def test_padding_does_not_change_a_score(tmp_path: Path) -> None:
    build_cross_encoder(tmp_path)  # [PAD] has weight 5: any leak would move the score a lot
    reranker = CrossEncoderReranker(tmp_path)

    alone = reranker.score(QUERY, ["dog"])[0]
    with_longer = reranker.score(QUERY, ["dog", "the dog ran far far far on the mat"])[0]

    assert alone == pytest.approx(with_longer, rel=1e-6)


def test_no_passages_gives_empty_scores(tmp_path: Path) -> None:
    build_cross_encoder(tmp_path)

    scores = CrossEncoderReranker(tmp_path).score(QUERY, [])

    assert scores.shape == (0,)
    assert scores.dtype == np.float32


def test_sigmoid_is_stable_for_extreme_logits() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning would fail the test
        values = sigmoid(np.array([-1000.0, 0.0, 1000.0]))

    np.testing.assert_allclose(values, [0.0, 0.5, 1.0])


def test_graph_without_single_logit_is_rejected(tmp_path: Path) -> None:
    build_embedding_model(tmp_path)  # outputs [batch, seq, 8], not [batch, 1]

    with pytest.raises(OnnxModelError, match=r"one logit per pair"):
        CrossEncoderReranker(tmp_path).score(QUERY, PASSAGES)


def test_missing_model_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OnnxModelError, match="does not exist"):
        CrossEncoderReranker(tmp_path / "no-model-here")


def test_load_reranker_unconfigured_is_none() -> None:
    assert load_reranker(None) is None
    assert load_reranker("") is None
    assert load_reranker("  ") is None


def test_load_reranker_loads_once(tmp_path: Path) -> None:
    build_cross_encoder(tmp_path)

    reranker = load_reranker(str(tmp_path))

    assert isinstance(reranker, CrossEncoderReranker)
    assert load_reranker(str(tmp_path)) is reranker
    assert reranker.score(QUERY, ["dog"]).shape == (1,)
