"""Cross-encoder reranking of search candidates (seed model: Xenova/ms-marco-MiniLM-L-6-v2).

A cross-encoder reads query and passage together, so it judges relevance far better than
comparing two independent embeddings, at the cost of one model run per candidate: it only
reorders the few hybrid-search candidates. Scores are sigmoid(logit) in [0, 1] so they can be
thresholded like the other search scores.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memory_dag.embed.onnx_models import OnnxModel, OnnxModelError

SEED_RERANKER_MODEL = "Xenova/ms-marco-MiniLM-L-6-v2"
#: Query plus a whole chunk (~400 tokens) must fit; ms-marco MiniLM was trained at 512.
RERANKER_MAX_LENGTH = 512
RERANKER_BATCH = 16


class CrossEncoderReranker:
    """Scores (query, passage) pairs with an ONNX cross-encoder whose output is one logit."""

    def __init__(
        self,
        model: str | Path,
        max_length: int = RERANKER_MAX_LENGTH,
        batch_size: int = RERANKER_BATCH,
    ) -> None:
        self.model = str(model)
        self._onnx = OnnxModel(model, max_length=max_length, batch_size=batch_size)

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """Relevance of each passage to the query, float32 in [0, 1], in passage order."""
        passages = list(passages)
        scores = np.zeros(len(passages), dtype=np.float32)
        pairs = [(query, passage) for passage in passages]
        for batch in self._onnx.run(pairs):
            scores[batch.indices] = sigmoid(self._logits(batch.output))
        return scores

    def _logits(self, output: np.ndarray) -> np.ndarray:
        if output.ndim == 2 and output.shape[1] == 1:
            return output[:, 0].astype(np.float32)
        raise OnnxModelError(
            f"{self._onnx.files.graph} gives output of shape {output.shape}; a cross-encoder "
            "must give one logit per pair, shape [batch, 1]"
        )


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow warnings for large negative logits."""
    return np.exp(-np.logaddexp(0.0, -x)).astype(np.float32)


@functools.lru_cache(maxsize=4)
def load_reranker(model: str | None) -> CrossEncoderReranker | None:
    """The reranker for a configured model, loaded once per process; None when not configured."""
    if not model or not model.strip():
        return None
    return CrossEncoderReranker(model.strip())
