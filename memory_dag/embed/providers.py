"""Text embeddings behind one small interface: WordLlama (default, offline), ONNX models, OpenAI.

Every provider returns float32 rows that are L2-normalised, so inner product = cosine in FAISS;
a text with nothing to embed (e.g. blank) gives a zero row rather than NaNs. Heavy libraries and
model files load on first use, never at import: Dagster imports this module when it loads the
code location, and a provider may be built and never used.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from memory_dag.config import Settings
from memory_dag.embed.onnx_models import OnnxModel, OnnxModelError

if TYPE_CHECKING:
    import openai
    from wordllama.inference import WordLlamaInference

    from memory_dag.embed.bag_of_tokens import BagOfTokens

DEFAULT_WORDLLAMA_CONFIG = "l2_supercat"
#: The only WordLlama weights that ship in the wheel; smaller dims are Matryoshka truncations.
WORDLLAMA_SHIPPED_DIM = 256

DEFAULT_ONNX_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
ONNX_MAX_LENGTH = 256
#: Texts per ONNX run; transformer cost grows with batch x length^2, so keep batches small.
ONNX_BATCH = 32

DEFAULT_OPENAI_MODEL = "text-embedding-3-small"
OPENAI_KNOWN_DIMS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
OPENAI_MAX_RETRIES = 3

#: Embedded when a provider must learn its width from a real answer.
_PROBE_TEXT = "dimension probe"


def _import_wordllama() -> Any:
    """Import wordllama without the root-logger handler its `logging.basicConfig` call adds
    at import time (it would print every library's INFO logs to stderr)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import wordllama

    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    return wordllama


class EmbeddingError(RuntimeError):
    """Embeddings cannot be produced: missing model files, bad model, failing endpoint."""


class EmbeddingProvider(Protocol):
    """What the pipeline needs from an embedder; `model` is recorded next to stored vectors."""

    name: str
    model: str

    @property
    def dims(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Unit-length float32 rows; zero rows stay zero instead of becoming NaN."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Average token vectors over real tokens only, as sentence-transformers does.

    A rank-2 output is taken as already pooled (some exports include the pooling).
    """
    hidden = hidden.astype(np.float32, copy=False)
    if hidden.ndim == 2:
        return hidden
    mask = attention_mask.astype(np.float32)[:, :, None]
    counts = np.maximum(mask.sum(axis=1), 1.0)
    return (hidden * mask).sum(axis=1) / counts


class WordLlamaProvider:
    """Static token embeddings shipped in the wordllama wheel: fast, offline, no download."""

    name = "wordllama"

    def __init__(self, model: str = "") -> None:
        self.config, self._dims = _parse_wordllama_model(model or DEFAULT_WORDLLAMA_CONFIG)
        self.model = f"{self.config}_{self._dims}"
        self._wl: WordLlamaInference | None = None
        self._bag: BagOfTokens | None = None
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        return self._dims

    def _load(self) -> tuple[WordLlamaInference, BagOfTokens | None]:
        with self._lock:
            if self._wl is None:
                wordllama = _import_wordllama()
                trunc_dim = self._dims if self._dims < WORDLLAMA_SHIPPED_DIM else None
                try:
                    self._wl = wordllama.WordLlama.load(
                        config=self.config,
                        dim=max(self._dims, WORDLLAMA_SHIPPED_DIM),
                        trunc_dim=trunc_dim,
                        # The package folder: weights ship there, and nothing is ever fetched.
                        cache_dir=Path(wordllama.__file__).parent,
                        disable_download=True,
                    )
                except (AttributeError, ValueError, OSError) as exc:
                    raise EmbeddingError(
                        f"cannot load WordLlama model {self.model!r}: {exc} (the wheel ships "
                        f"{DEFAULT_WORDLLAMA_CONFIG}_{WORDLLAMA_SHIPPED_DIM}; smaller dims "
                        "such as _128 or _64 are truncations of it)"
                    ) from exc
                from memory_dag.embed.bag_of_tokens import BagOfTokens

                try:
                    self._bag = BagOfTokens(self._wl.tokenizer, self._wl.embedding.shape[0])
                except ValueError:  # not word-separable: WordLlama's own (slower) path
                    self._bag = None
            return self._wl, self._bag

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        wl, bag = self._load()
        if bag is None:  # a tokenizer the word split is not exact for: WordLlama's own path
            return l2_normalise(wl.embed(texts))
        # Mean pooling is linear: token counts @ token vectors, then unit length (the mean's
        # 1/len factor disappears in the normalisation).
        return l2_normalise(bag.token_sums(texts, wl.embedding))


def _parse_wordllama_model(model: str) -> tuple[str, int]:
    """'l2_supercat' -> ('l2_supercat', 256); 'l2_supercat_128' -> ('l2_supercat', 128)."""
    match = re.fullmatch(r"(.+)_(\d+)", model)
    if match:
        return match.group(1), int(match.group(2))
    return model, WORDLLAMA_SHIPPED_DIM


class OnnxProvider:
    """A sentence-transformers ONNX export: mean pooling over the attention mask, then L2."""

    name = "onnx"

    def __init__(
        self,
        model: str | Path = "",
        max_length: int = ONNX_MAX_LENGTH,
        batch_size: int = ONNX_BATCH,
    ) -> None:
        self.model = str(model) or DEFAULT_ONNX_MODEL
        self.max_length = max_length
        self.batch_size = batch_size
        self._onnx: OnnxModel | None = None
        self._dims: int | None = None
        self._lock = threading.Lock()

    def _load(self) -> OnnxModel:
        with self._lock:
            if self._onnx is None:
                try:
                    self._onnx = OnnxModel(self.model, self.max_length, self.batch_size)
                except OnnxModelError as exc:
                    raise EmbeddingError(str(exc)) from exc
            return self._onnx

    @property
    def dims(self) -> int:
        if self._dims is None:
            width = self._load().output_shape[-1]
            # Graphs may leave the hidden size symbolic; then one real run tells it.
            self._dims = width if isinstance(width, int) else self.embed([_PROBE_TEXT]).shape[1]
        return self._dims

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        onnx_model = self._load()
        out: np.ndarray | None = None
        try:
            for batch in onnx_model.run(texts):
                pooled = mean_pool(batch.output, batch.attention_mask)
                if out is None:
                    out = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
                out[batch.indices] = pooled
        except OnnxModelError as exc:
            raise EmbeddingError(str(exc)) from exc
        assert out is not None  # texts is not empty, so at least one batch ran
        return l2_normalise(out)


class OpenAIEmbeddingProvider:
    """Any OpenAI-compatible /v1/embeddings endpoint (OpenAI, vLLM, Ollama, llama.cpp, ...).

    Blank texts are not sent (OpenAI rejects empty inputs) and come back as zero rows.
    """

    name = "openai"

    def __init__(
        self,
        model: str = "",
        base_url: str | None = None,
        api_key: str | None = None,
        batch_size: int = 512,
        timeout: float = 60.0,
        max_retries: int = OPENAI_MAX_RETRIES,
    ) -> None:
        self.model = model or DEFAULT_OPENAI_MODEL
        self.base_url = base_url
        self.api_key = api_key
        self.batch_size = max(1, batch_size)
        self.timeout = timeout
        self.max_retries = max_retries
        self._dims: int | None = OPENAI_KNOWN_DIMS.get(self.model)
        self._client: openai.OpenAI | None = None
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        if self._dims is None:
            self._request([_PROBE_TEXT])  # sets _dims from the answer
        assert self._dims is not None
        return self._dims

    def _get_client(self) -> openai.OpenAI:
        with self._lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(
                    base_url=self.base_url,
                    # Local servers need no key, but the client refuses to start without one.
                    api_key=self.api_key or "not-needed",
                    max_retries=self.max_retries,
                    timeout=self.timeout,
                )
            return self._client

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        to_send = [i for i, text in enumerate(texts) if text.strip()]
        if not to_send:
            return np.zeros((len(texts), self.dims), dtype=np.float32)
        out: np.ndarray | None = None
        for start in range(0, len(to_send), self.batch_size):
            indices = to_send[start : start + self.batch_size]
            vectors = self._request([texts[i] for i in indices])
            if out is None:
                out = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
            out[indices] = vectors
        assert out is not None
        return l2_normalise(out)

    def _request(self, batch: list[str]) -> np.ndarray:
        """One embeddings call; rows in input order (the API may return them in any order)."""
        import openai

        where = self.base_url or "the OpenAI API"
        try:
            response = self._get_client().embeddings.create(
                model=self.model, input=batch, encoding_format="float"
            )
        except openai.APIError as exc:
            raise EmbeddingError(
                f"embeddings request to {where} (model {self.model!r}) failed, retried up to "
                f"{self.max_retries} times on transient errors: {exc}"
            ) from exc
        data = sorted(response.data, key=lambda item: item.index)
        if [item.index for item in data] != list(range(len(batch))):
            raise EmbeddingError(f"{where} returned {len(data)} embeddings for {len(batch)} inputs")
        vectors = np.array([item.embedding for item in data], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] == 0:
            raise EmbeddingError(f"{where} returned embeddings of shape {vectors.shape}")
        if self._dims is None:
            self._dims = int(vectors.shape[1])
        elif vectors.shape[1] != self._dims:
            raise EmbeddingError(
                f"{where} returned {vectors.shape[1]}-dim embeddings for model {self.model!r}, "
                f"expected {self._dims}"
            )
        return vectors


_PROVIDERS: dict[tuple[object, ...], EmbeddingProvider] = {}
_PROVIDERS_LOCK = threading.Lock()


def get_provider(settings: Settings) -> EmbeddingProvider:
    """The provider the settings describe, shared per configuration so models load only once."""
    base_url = settings.embedding_base_url or settings.llm_base_url
    key = (
        settings.embedding_provider,
        settings.embedding_model,
        base_url,
        settings.embedding_batch_size,
        settings.llm_api_key,
        settings.llm_timeout,
    )
    with _PROVIDERS_LOCK:
        provider = _PROVIDERS.get(key)
        if provider is None:
            provider = _build_provider(settings, base_url)
            _PROVIDERS[key] = provider
        return provider


def _build_provider(settings: Settings, base_url: str | None) -> EmbeddingProvider:
    if settings.embedding_provider == "wordllama":
        return WordLlamaProvider(settings.embedding_model)
    if settings.embedding_provider == "onnx":
        return OnnxProvider(settings.embedding_model)
    if settings.embedding_provider == "openai":
        return OpenAIEmbeddingProvider(
            model=settings.embedding_model,
            base_url=base_url,
            api_key=settings.llm_api_key,
            batch_size=settings.embedding_batch_size,
            timeout=settings.llm_timeout,
        )
    raise EmbeddingError(
        f"unknown embedding provider {settings.embedding_provider!r}: "
        "expected 'wordllama', 'onnx' or 'openai'"
    )
