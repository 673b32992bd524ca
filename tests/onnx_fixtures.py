"""Tiny ONNX models and tokenizers built in a temp folder, with weights the tests can recompute.

The graphs are real ONNX run by onnxruntime, and the tokenizer is a real `tokenizers` file, so the
code under test runs exactly as with a downloaded model; only the sizes are toy sized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]",
    "the", "cat", "sat", "on", "mat", "dog", "ran", "far", "a", "bird", "sang", "loud",
]  # fmt: skip
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
CLS, SEP = TOKEN_ID["[CLS]"], TOKEN_ID["[SEP]"]
HIDDEN = 8
OPSET = 17


def token_ids(text: str) -> list[int]:
    """Word ids the fixture tokenizer gives `text` (before [CLS]/[SEP] are added)."""
    return [TOKEN_ID.get(word, TOKEN_ID["[UNK]"]) for word in text.split()]


def write_tokenizer(folder: Path) -> Path:
    """A WordLevel tokenizer.json shaped like a BERT export, including its fixed padding.

    sentence-transformers exports ship fixed-length padding and truncation (128); the loader
    must replace both, so the fixture ships them too (padding 16, truncation 12).
    """
    tokenizer = Tokenizer(WordLevel(TOKEN_ID, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
    )
    tokenizer.enable_padding(pad_id=TOKEN_ID["[PAD]"], pad_token="[PAD]", length=16)
    tokenizer.enable_truncation(max_length=12)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_model_max_length(folder: Path, max_length: int) -> None:
    """tokenizer_config.json as HF writes it, declaring the model's sequence limit."""
    (folder / "tokenizer_config.json").write_text(f'{{"model_max_length": {max_length}}}')


def _int_input(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9  # understood by every onnxruntime we support
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@dataclass(frozen=True)
class EmbeddingModel:
    """A toy BERT: last_hidden_state = token_table[input_ids] + type_table[token_type_ids]."""

    folder: Path
    token_table: np.ndarray  # (vocab, HIDDEN)
    type_table: np.ndarray | None  # (2, HIDDEN), None when the graph has no token_type_ids

    def expected(self, text: str, max_length: int | None = None) -> np.ndarray:
        """The sentence vector by hand: mean over [CLS] words [SEP], then L2-normalised."""
        words = token_ids(text)
        if max_length is not None:
            words = words[: max_length - 2]
        ids = [CLS, *words, SEP]
        hidden = self.token_table[ids]
        if self.type_table is not None:
            hidden = hidden + self.type_table[0]
        vector = hidden.mean(axis=0)
        return vector / np.linalg.norm(vector)


def build_embedding_model(
    folder: Path,
    *,
    seed: int = 0,
    with_token_type_ids: bool = True,
    graph_name: str = "model.onnx",
    symbolic_hidden: bool = False,
    tokenizer: bool = True,
) -> EmbeddingModel:
    """Write an embedding graph (and tokenizer.json) into `folder`.

    Every row of the tables is non-zero, [PAD] included, so pooling that counted padding would
    change the result and fail the tests.
    """
    rng = np.random.default_rng(seed)
    token_table = rng.uniform(0.1, 1.0, (len(VOCAB), HIDDEN)).astype(np.float32)
    token_table *= rng.choice([-1.0, 1.0], token_table.shape).astype(np.float32)
    type_table = rng.uniform(-0.5, 0.5, (2, HIDDEN)).astype(np.float32)

    inputs = [_int_input("input_ids"), _int_input("attention_mask")]
    initializers = [numpy_helper.from_array(token_table, "token_table")]
    nodes = [helper.make_node("Gather", ["token_table", "input_ids"], ["token_vectors"])]
    if with_token_type_ids:
        inputs.append(_int_input("token_type_ids"))
        initializers.append(numpy_helper.from_array(type_table, "type_table"))
        nodes.append(helper.make_node("Gather", ["type_table", "token_type_ids"], ["type_vectors"]))
        nodes.append(
            helper.make_node("Add", ["token_vectors", "type_vectors"], ["last_hidden_state"])
        )
    else:
        nodes.append(helper.make_node("Identity", ["token_vectors"], ["last_hidden_state"]))
    hidden_dim: int | str = "hidden" if symbolic_hidden else HIDDEN
    output = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden_dim]
    )
    graph = helper.make_graph(nodes, "tiny_bert", inputs, [output], initializer=initializers)
    _save(graph, folder / graph_name)
    if tokenizer:
        write_tokenizer(folder)
    return EmbeddingModel(
        folder=folder,
        token_table=token_table,
        type_table=type_table if with_token_type_ids else None,
    )


@dataclass(frozen=True)
class CrossEncoderModel:
    """A toy cross-encoder: logit = sum over real tokens of token_weight[id] + type_weight[type]."""

    folder: Path
    token_weight: np.ndarray  # (vocab,)
    type_weight: np.ndarray  # (2,)

    def expected_logit(self, query: str, passage: str) -> float:
        """By hand: [CLS] query [SEP] are segment 0, passage [SEP] are segment 1."""
        first = [CLS, *token_ids(query), SEP]
        second = [*token_ids(passage), SEP]
        total = self.token_weight[first].sum() + self.type_weight[0] * len(first)
        total += self.token_weight[second].sum() + self.type_weight[1] * len(second)
        return float(total)


def build_cross_encoder(folder: Path, *, seed: int = 1) -> CrossEncoderModel:
    """Write a cross-encoder graph with output `logits` [batch, 1] (and tokenizer.json).

    [PAD] has a large weight, so a score that let padding in would be visibly wrong.
    """
    rng = np.random.default_rng(seed)
    token_weight = rng.uniform(-0.6, 0.6, len(VOCAB)).astype(np.float32)
    token_weight[TOKEN_ID["[PAD]"]] = 5.0
    type_weight = np.array([0.05, -0.2], dtype=np.float32)

    inputs = [_int_input("input_ids"), _int_input("attention_mask"), _int_input("token_type_ids")]
    initializers = [
        numpy_helper.from_array(token_weight, "token_weight"),
        numpy_helper.from_array(type_weight, "type_weight"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "seq_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["token_weight", "input_ids"], ["token_scores"]),
        helper.make_node("Gather", ["type_weight", "token_type_ids"], ["type_scores"]),
        helper.make_node("Add", ["token_scores", "type_scores"], ["scores"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["scores", "mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq_axis"], ["logits"], keepdims=1),
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    graph = helper.make_graph(nodes, "tiny_cross_encoder", inputs, [output], initializers)
    _save(graph, folder / "model.onnx")
    write_tokenizer(folder)
    return CrossEncoderModel(folder=folder, token_weight=token_weight, type_weight=type_weight)
