"""Embedding providers: ONNX against hand-computed vectors, WordLlama for real, OpenAI over HTTP."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from memory_dag.config import Settings
from memory_dag.embed.bag_of_tokens import WORD_SPLIT_MIN_TEXTS, BagOfTokens
from memory_dag.embed.providers import (
    EmbeddingError,
    OnnxProvider,
    OpenAIEmbeddingProvider,
    WordLlamaProvider,
    get_provider,
    l2_normalise,
)
from tests.onnx_fixtures import build_embedding_model, write_model_max_length
from tests.openai_server import ScriptedOpenAIServer, hash_embedding

REPO_ROOT = Path(__file__).resolve().parents[2]

# Mixed lengths and an unknown word ("zebra" -> [UNK]), not in length order, so the internal
# length sort has to put rows back in place.
TEXTS = [
    "a bird sang loud far far far on the mat",
    "the cat sat on the mat",
    "zebra cat",
    "dog ran",
    "the",
    # 16 tokens: longer than the 12 the fixture's tokenizer.json truncates to, as exports do.
    "the cat sat on the mat the dog ran far the bird sang loud",
]


def assert_unit_rows(vectors: np.ndarray) -> None:
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_l2_normalise_keeps_zero_rows_zero() -> None:
    vectors = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float64)
    out = l2_normalise(vectors)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


# --- ONNX ----------------------------------------------------------------------------------


def test_onnx_matches_hand_computed_mean_pooling(tmp_path: Path) -> None:
    model = build_embedding_model(tmp_path)
    provider = OnnxProvider(tmp_path, batch_size=2)  # 6 texts: batches cross boundaries

    vectors = provider.embed(TEXTS)

    assert vectors.shape == (len(TEXTS), 8)
    assert vectors.dtype == np.float32
    expected = np.array([model.expected(text) for text in TEXTS])
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)
    assert provider.name == "onnx"
    assert provider.model == str(tmp_path)
    assert provider.dims == 8


def test_onnx_padding_does_not_change_a_vector(tmp_path: Path) -> None:
    build_embedding_model(tmp_path)
    provider = OnnxProvider(tmp_path)

    alone = provider.embed(["dog ran"])[0]
    padded = provider.embed(["dog ran", "the cat sat on the mat far far far"])[0]

    np.testing.assert_allclose(alone, padded, rtol=1e-6, atol=1e-7)


def test_onnx_graph_without_token_type_ids(tmp_path: Path) -> None:
    model = build_embedding_model(tmp_path, with_token_type_ids=False)

    vectors = OnnxProvider(tmp_path).embed(TEXTS)

    np.testing.assert_allclose(
        vectors, [model.expected(text) for text in TEXTS], rtol=1e-5, atol=1e-6
    )


def test_onnx_truncates_to_the_model_max_length(tmp_path: Path) -> None:
    model = build_embedding_model(tmp_path)
    write_model_max_length(tmp_path, 6)  # [CLS] + 4 words + [SEP]
    provider = OnnxProvider(tmp_path)
    long_text = "the cat sat on the mat dog ran far"

    vector = provider.embed([long_text])[0]

    np.testing.assert_allclose(vector, model.expected(long_text, max_length=6), rtol=1e-5)
    np.testing.assert_allclose(vector, model.expected("the cat sat on"), rtol=1e-5)


def test_onnx_empty_input_and_symbolic_width(tmp_path: Path) -> None:
    build_embedding_model(tmp_path, symbolic_hidden=True)
    provider = OnnxProvider(tmp_path)

    assert provider.dims == 8  # learned from a probe run: the graph does not declare it
    assert provider.embed([]).shape == (0, 8)


def test_onnx_finds_graph_in_onnx_subfolder(tmp_path: Path) -> None:
    model = build_embedding_model(tmp_path, graph_name="onnx/model.onnx")

    vectors = OnnxProvider(tmp_path).embed(["the cat"])

    np.testing.assert_allclose(vectors[0], model.expected("the cat"), rtol=1e-5)


def test_onnx_prefers_full_precision_over_quantized(tmp_path: Path) -> None:
    fp32 = build_embedding_model(tmp_path, seed=0, graph_name="onnx/model.onnx")
    quantized = build_embedding_model(tmp_path, seed=7, graph_name="onnx/model_quantized.onnx")

    vector = OnnxProvider(tmp_path).embed(["the cat"])[0]

    np.testing.assert_allclose(vector, fp32.expected("the cat"), rtol=1e-5)
    assert not np.allclose(vector, quantized.expected("the cat"), rtol=1e-3)


def test_onnx_uses_quantized_graph_when_it_is_the_only_one(tmp_path: Path) -> None:
    quantized = build_embedding_model(tmp_path, seed=7, graph_name="model_quantized.onnx")

    vector = OnnxProvider(tmp_path).embed(["the cat"])[0]

    np.testing.assert_allclose(vector, quantized.expected("the cat"), rtol=1e-5)


def test_onnx_model_can_name_a_graph_file(tmp_path: Path) -> None:
    """Naming a .onnx file is how a user opts into a quantized graph."""
    build_embedding_model(tmp_path, seed=0, graph_name="onnx/model.onnx")
    quantized = build_embedding_model(tmp_path, seed=7, graph_name="onnx/model_quantized.onnx")
    write_model_max_length(tmp_path, 4)  # found next to tokenizer.json, one level up

    provider = OnnxProvider(tmp_path / "onnx" / "model_quantized.onnx")
    vector = provider.embed(["the cat sat on the mat"])[0]

    np.testing.assert_allclose(vector, quantized.expected("the cat"), rtol=1e-5)


def test_onnx_missing_graph_is_a_clear_error(tmp_path: Path) -> None:
    build_embedding_model(tmp_path)
    (tmp_path / "model.onnx").unlink()

    with pytest.raises(EmbeddingError, match=r"no ONNX graph in .*model\.onnx"):
        OnnxProvider(tmp_path).embed(["the cat"])


def test_onnx_missing_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    build_embedding_model(tmp_path, tokenizer=False)

    with pytest.raises(EmbeddingError, match="no tokenizer.json"):
        OnnxProvider(tmp_path).embed(["the cat"])


def test_onnx_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "not-here"

    with pytest.raises(EmbeddingError, match="does not exist"):
        OnnxProvider(missing).embed(["the cat"])


def test_onnx_hub_name_without_huggingface_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes `import huggingface_hub` fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)

    with pytest.raises(EmbeddingError, match="pip install huggingface_hub"):
        OnnxProvider("memory-dag-tests/no-such-model").embed(["the cat"])


def test_onnx_hub_name_offline_and_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # also guarantees no network access is tried

    with pytest.raises(EmbeddingError, match="HF_HUB_OFFLINE is set"):
        OnnxProvider("memory-dag-tests/no-such-model").embed(["the cat"])


def test_onnx_hub_name_resolves_from_the_local_hub_cache(tmp_path: Path) -> None:
    """A hub name found in the HF cache loads offline. Run in a subprocess because
    huggingface_hub fixes its cache folder and offline flag when first imported."""
    pytest.importorskip("huggingface_hub")
    commit = "0" * 40
    repo_cache = tmp_path / "hub" / "models--memory-dag-tests--tiny"
    (repo_cache / "refs").mkdir(parents=True)
    (repo_cache / "refs" / "main").write_text(commit)
    model = build_embedding_model(repo_cache / "snapshots" / commit, graph_name="onnx/model.onnx")
    script = (
        "import json; from memory_dag.embed.providers import OnnxProvider; "
        "print(json.dumps(OnnxProvider('memory-dag-tests/tiny').embed(['the cat']).tolist()))"
    )
    env = os.environ | {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}

    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    vector = np.array(json.loads(result.stdout)[0])
    np.testing.assert_allclose(vector, model.expected("the cat"), rtol=1e-5)


# --- WordLlama -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wordllama() -> WordLlamaProvider:
    return WordLlamaProvider()


def test_wordllama_shape_norm_and_model_id(wordllama: WordLlamaProvider) -> None:
    vectors = wordllama.embed(["the cat sat on the mat", "quarterly revenue grew"])

    assert (wordllama.name, wordllama.model) == ("wordllama", "l2_supercat_256")
    assert wordllama.dims == 256
    assert vectors.shape == (2, 256)
    assert vectors.dtype == np.float32
    assert_unit_rows(vectors)


def test_wordllama_similar_sentences_are_closer(wordllama: WordLlamaProvider) -> None:
    anchor, similar, unrelated = wordllama.embed(
        [
            "The user's dog is called Biscuit and loves long walks.",
            "Biscuit, the user's dog, enjoys going for long walks.",
            "Quarterly tax filings are due at the end of March.",
        ]
    )

    assert anchor @ similar > anchor @ unrelated + 0.1


def test_wordllama_keeps_input_order(wordllama: WordLlamaProvider) -> None:
    texts = ["a much longer sentence about the weather in Lisbon in spring", "hi", "tea or coffee"]

    batched = wordllama.embed(texts)
    one_by_one = np.vstack([wordllama.embed([text]) for text in texts])

    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-6)


def test_wordllama_empty_input_and_blank_text(wordllama: WordLlamaProvider) -> None:
    assert wordllama.embed([]).shape == (0, 256)
    vectors = wordllama.embed(["", "hello there"])
    np.testing.assert_array_equal(vectors[0], 0.0)  # nothing to embed: zero, not NaN
    assert_unit_rows(vectors[1:])


# Strings that take each path of the word-split tokenization (bag_of_tokens.py): plain words,
# runs of spaces, a leading space, special tokens, a literal "▁", other whitespace, scripts
# the vocabulary lacks (byte fallback), digits and punctuation.
TRICKY_TEXTS = [
    "Caroline went to the LGBTQ support group yesterday, and it was powerful.",
    "  double  spaces and 12345 digits, émojis 🎉 and CamelCase-words!!",
    "def f():\n    return 1",  # "▁▁▁" is one token here: runs of spaces need the whole text
    "col1   col2",
    " leading space",
    "trailing space ",
    "",
    " ",
    "x <s> y </s> <unk>",
    "lit▁eral ▁mark ▁▁ runs",
    "a\nb\tc\n\n  indented line",
    "ünïcödé ñ 中文字符 日本語 Ελληνικά",
    "a\u00a0non-breaking space",
    "https://example.com/path?q=1&r=2 — em dash… ellipsis",
]


def test_wordllama_word_split_equals_wordllamas_own_embed(wordllama: WordLlamaProvider) -> None:
    wl, bag = wordllama._load()
    assert bag is not None  # the shipped tokenizer is word-separable: the fast path is used
    corpus = TRICKY_TEXTS * 3 + [f"turn {i}: she said it {i % 7} times" for i in range(400)]
    assert len(corpus) >= WORD_SPLIT_MIN_TEXTS  # big enough for the word split

    ours = wordllama.embed(corpus)

    np.testing.assert_allclose(ours, l2_normalise(wl.embed(corpus)), rtol=0, atol=1e-6)


def test_wordllama_small_batches_equal_wordllamas_own_embed(
    wordllama: WordLlamaProvider,
) -> None:
    """A query or a few texts take the direct path (token rows summed, no sparse matrix)."""
    wl, _ = wordllama._load()
    assert len(TRICKY_TEXTS) < WORD_SPLIT_MIN_TEXTS

    ours = wordllama.embed(TRICKY_TEXTS)

    np.testing.assert_allclose(ours, l2_normalise(wl.embed(TRICKY_TEXTS)), rtol=0, atol=1e-6)
    for text, vector in zip(TRICKY_TEXTS, ours, strict=True):  # one at a time, as a search
        np.testing.assert_allclose(wordllama.embed([text])[0], vector, rtol=0, atol=1e-6)


def test_wordllama_token_counts_equal_the_tokenizer(wordllama: WordLlamaProvider) -> None:
    wl, _ = wordllama._load()
    bag = BagOfTokens(wl.tokenizer, wl.embedding.shape[0], split_min_texts=1)

    counts = bag.counts(TRICKY_TEXTS).toarray()

    for row, text in zip(counts, TRICKY_TEXTS, strict=True):
        # One text at a time: WordLlama's tokenizer pads only to the longest text of a batch.
        ids = np.asarray(wl.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        np.testing.assert_array_equal(
            row, np.bincount(ids, minlength=counts.shape[1]), err_msg=repr(text)
        )


def test_word_cache_overflow_keeps_counts_exact(
    wordllama: WordLlamaProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memory_dag.embed.bag_of_tokens as bag_of_tokens

    wl, _ = wordllama._load()
    bag = BagOfTokens(wl.tokenizer, wl.embedding.shape[0], split_min_texts=1)
    monkeypatch.setattr(bag_of_tokens, "WORD_CACHE_SIZE", 4)
    batches = [["the cat sat", "on the mat"], ["the dog ran far", "cat and dog and bird"]]

    for texts in batches * 2:  # the cache fills, overflows and is rebuilt between calls
        got = bag.counts(texts).toarray()
        expected = bag._whole_counts(texts).toarray()
        np.testing.assert_array_equal(got, expected)
    # Cleared on overflow, so it holds the last call's words only (not all 10 seen).
    assert set(bag._word_cache) == {"the", "dog", "ran", "far", "cat", "and", "bird"}


def test_threads_of_one_call_give_the_vectors_one_thread_gives(
    wordllama: WordLlamaProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big call is counted in slices (`SLICE_TEXTS`) by a thread a core, which fill one word
    cache (here overflowing it while they run): the same vectors bit for bit as one thread, so
    a store's vectors do not depend on the cores of the machine that embedded them."""
    import memory_dag.embed.bag_of_tokens as bag_of_tokens

    wl, _ = wordllama._load()
    monkeypatch.setattr(bag_of_tokens, "SLICE_TEXTS", 300)
    monkeypatch.setattr(bag_of_tokens, "WORD_CACHE_SIZE", 50)
    corpus = TRICKY_TEXTS * 10 + [f"turn {i}: word{i} and word{i % 13} again" for i in range(800)]
    threaded = BagOfTokens(wl.tokenizer, wl.embedding.shape[0], threads=3)
    alone = BagOfTokens(wl.tokenizer, wl.embedding.shape[0], threads=1)

    expected = alone.token_sums(corpus, wl.embedding)
    threads_before = threading.active_count()
    for _ in range(3):
        np.testing.assert_array_equal(threaded.token_sums(corpus, wl.embedding), expected)
    assert threading.active_count() == threads_before  # none is left behind
    np.testing.assert_allclose(
        l2_normalise(expected), l2_normalise(wl.embed(corpus)), rtol=0, atol=1e-6
    )


def test_word_split_is_refused_for_other_tokenizers() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from memory_dag.embed.bag_of_tokens import is_word_separable

    word_level = Tokenizer(models.WordLevel({"[UNK]": 0, "cat": 1}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()

    assert not is_word_separable(word_level)
    with pytest.raises(ValueError, match="not a SentencePiece-style BPE"):
        BagOfTokens(word_level, 2)


def test_wordllama_matryoshka_truncation() -> None:
    provider = WordLlamaProvider("l2_supercat_64")

    vectors = provider.embed(["the cat sat on the mat"])

    assert (provider.model, provider.dims, vectors.shape) == ("l2_supercat_64", 64, (1, 64))
    assert_unit_rows(vectors)


def test_wordllama_unknown_config_is_a_clear_error() -> None:
    with pytest.raises(EmbeddingError, match="cannot load WordLlama model 'no_such_config_256'"):
        WordLlamaProvider("no_such_config").embed(["x"])


# --- get_provider --------------------------------------------------------------------------


def test_get_provider_defaults_to_wordllama_and_caches() -> None:
    settings = Settings()

    provider = get_provider(settings)

    assert isinstance(provider, WordLlamaProvider)
    assert provider.model == "l2_supercat_256"
    assert get_provider(Settings()) is provider
    assert get_provider(Settings(embedding_model="l2_supercat_128")) is not provider


def test_get_provider_onnx_loads_lazily(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    settings = Settings(embedding_provider="onnx", embedding_model=str(folder))

    provider = get_provider(settings)  # the folder does not exist yet: nothing is loaded
    model = build_embedding_model(folder)

    assert provider.name == "onnx"
    np.testing.assert_allclose(provider.embed(["the cat"])[0], model.expected("the cat"), rtol=1e-5)


def test_get_provider_onnx_default_model() -> None:
    provider = get_provider(Settings(embedding_provider="onnx"))

    assert provider.model == "sentence-transformers/all-MiniLM-L6-v2"


# --- OpenAI-compatible endpoint ------------------------------------------------------------


def server_vector(text: str, dims: int = 8) -> np.ndarray:
    return np.array(hash_embedding(text, dims), dtype=np.float32)


def embedding_requests(server: ScriptedOpenAIServer) -> list[dict[str, object]]:
    return [r["body"] for r in server.requests if r["path"].endswith("/embeddings")]


def test_openai_batches_in_order_and_normalises(openai_server: ScriptedOpenAIServer) -> None:
    texts = [f"memory number {i}" for i in range(7)]
    provider = OpenAIEmbeddingProvider(
        model="local-embedder", base_url=openai_server.base_url, batch_size=3
    )

    vectors = provider.embed(texts)

    sent = embedding_requests(openai_server)
    assert len(sent) == math.ceil(len(texts) / 3)
    assert [body["input"] for body in sent] == [texts[0:3], texts[3:6], texts[6:7]]
    assert all(body["model"] == "local-embedder" for body in sent)
    np.testing.assert_allclose(vectors, [server_vector(t) for t in texts], rtol=1e-5, atol=1e-6)
    assert_unit_rows(vectors)
    assert provider.dims == 8  # learned from the answers
    assert len(embedding_requests(openai_server)) == 3  # ...without another request


def test_openai_blank_texts_are_zero_rows_and_not_sent(
    openai_server: ScriptedOpenAIServer,
) -> None:
    provider = OpenAIEmbeddingProvider(model="local-embedder", base_url=openai_server.base_url)

    vectors = provider.embed(["first", "  ", "second"])

    assert [body["input"] for body in embedding_requests(openai_server)] == [["first", "second"]]
    np.testing.assert_array_equal(vectors[1], 0.0)
    np.testing.assert_allclose(vectors[2], server_vector("second"), rtol=1e-5, atol=1e-6)


def test_openai_dims_probe_for_unknown_model(openai_server: ScriptedOpenAIServer) -> None:
    provider = OpenAIEmbeddingProvider(model="local-embedder", base_url=openai_server.base_url)

    assert provider.embed([]).shape == (0, 8)
    assert len(embedding_requests(openai_server)) == 1


def test_openai_known_model_dims_need_no_request() -> None:
    provider = OpenAIEmbeddingProvider(base_url="http://127.0.0.1:9/v1")

    assert (provider.model, provider.dims) == ("text-embedding-3-small", 1536)


def test_openai_retries_a_transient_failure(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push_embedding_failure(500, times=1)
    provider = OpenAIEmbeddingProvider(
        model="local-embedder", base_url=openai_server.base_url, max_retries=1
    )

    vectors = provider.embed(["hello"])

    assert len(embedding_requests(openai_server)) == 2
    np.testing.assert_allclose(vectors[0], server_vector("hello"), rtol=1e-5, atol=1e-6)


def test_openai_persistent_500_raises_embedding_error(
    openai_server: ScriptedOpenAIServer,
) -> None:
    openai_server.push_embedding_failure(500, times=2)
    provider = OpenAIEmbeddingProvider(
        model="local-embedder", base_url=openai_server.base_url, max_retries=1
    )

    with pytest.raises(EmbeddingError, match="retried up to 1 times.*scripted embeddings failure"):
        provider.embed(["hello"])
    assert len(embedding_requests(openai_server)) == 2


def test_get_provider_openai_uses_settings(openai_server: ScriptedOpenAIServer) -> None:
    # No embedding_base_url: the LLM endpoint is used; the batch size comes from settings.
    settings = Settings(
        embedding_provider="openai",
        embedding_model="local-embedder",
        llm_base_url=openai_server.base_url,
        embedding_batch_size=2,
    )

    provider = get_provider(settings)
    vectors = provider.embed(["a", "b", "c"])

    assert (provider.name, provider.model) == ("openai", "local-embedder")
    assert vectors.shape == (3, 8)
    assert len(embedding_requests(openai_server)) == 2
