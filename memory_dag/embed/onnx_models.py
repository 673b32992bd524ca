"""Shared loading and running of sentence-transformers style ONNX exports.

Used by the ONNX embedding provider and the cross-encoder reranker. A model is a folder holding
`tokenizer.json` and an ONNX graph, or a Hugging Face Hub name resolved to such a folder through
`huggingface_hub` (optional: it is not a dependency). onnxruntime is imported only when a model is
loaded, because Dagster imports our modules when it loads the code location.

File choice: the full-precision `model.onnx` (top level, then `onnx/`) is preferred over
quantized variants. Quantized int8 graphs give results that differ between CPU instruction sets
and drift from the reference model, and vectors stored in an index must stay comparable across
machines; MiniLM-sized fp32 models are fast enough on CPU. A quantized file is used only when it is
the sole graph in the folder, or when the model path names a `.onnx` file directly.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Encoding, Tokenizer

#: Graph files looked for in a model folder, best first (see the module docstring).
ONNX_CANDIDATES: tuple[str, ...] = (
    "model.onnx",
    "onnx/model.onnx",
    "model_quantized.onnx",
    "onnx/model_quantized.onnx",
    "model_int8.onnx",
    "onnx/model_int8.onnx",
)

#: What to fetch from the Hub: the tokenizer, the length limits and the fp32 graph only
#: (`*.onnx_data` holds the weights of graphs saved with external data).
HUB_ALLOW_PATTERNS: list[str] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "sentence_bert_config.json",
    "model.onnx",
    "model.onnx_data",
    "onnx/model.onnx",
    "onnx/model.onnx_data",
]

#: Inputs we know how to fill; BERT-like exports declare two or three of them.
KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids"})

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

#: tokenizer_config.json uses a huge sentinel for "no limit".
_NO_LIMIT = 1_000_000


class OnnxModelError(RuntimeError):
    """A model folder or hub name cannot be turned into a working ONNX model."""


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's graph and tokenizer live once resolved (configs sit by the tokenizer)."""

    graph: Path
    tokenizer: Path


def resolve_model_files(model: str | Path) -> ModelFiles:
    """Find the graph and tokenizer for a local folder, a `.onnx` file, or a Hub name."""
    text = str(model).strip()
    if not text:
        raise OnnxModelError("no ONNX model given: pass a local folder or a Hugging Face Hub name")
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix != ".onnx":
            raise OnnxModelError(f"{path} is a file but not an .onnx graph")
        return ModelFiles(graph=path, tokenizer=_find_tokenizer(path))
    if path.is_dir():
        return _files_in_folder(path)
    if isinstance(model, Path) or not _HUB_NAME.match(text):
        raise OnnxModelError(
            f"ONNX model folder {path} does not exist (and {text!r} is not a Hub name like "
            "'sentence-transformers/all-MiniLM-L6-v2')"
        )
    return _files_in_folder(download_from_hub(text))


def download_from_hub(name: str) -> Path:
    """Fetch (or find in the local cache) the files of a Hub model; honours HF_HUB_OFFLINE."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise OnnxModelError(
            f"{name!r} is not a local folder, and downloading it from the Hugging Face Hub needs "
            "the huggingface_hub package: `pip install huggingface_hub`, or pass a local folder "
            "containing tokenizer.json and model.onnx"
        ) from exc
    # huggingface_hub reads HF_HUB_OFFLINE once at import; read it again so a late setting counts.
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    try:
        folder = snapshot_download(
            name, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline
        )
    except Exception as exc:  # the hub raises many error types; all mean "no usable files"
        hint = (
            " HF_HUB_OFFLINE is set and the model is not in the local Hugging Face cache."
            if offline
            else ""
        )
        raise OnnxModelError(
            f"could not get {name!r} from the Hugging Face Hub ({exc}).{hint} "
            "Download it once with network access, or pass a local folder."
        ) from exc
    return Path(str(folder))


def _files_in_folder(folder: Path) -> ModelFiles:
    graph = next((folder / c for c in ONNX_CANDIDATES if (folder / c).is_file()), None)
    if graph is None:
        raise OnnxModelError(
            f"no ONNX graph in {folder}: expected one of {', '.join(ONNX_CANDIDATES)}"
        )
    return ModelFiles(graph=graph, tokenizer=_find_tokenizer(graph))


def _find_tokenizer(graph: Path) -> Path:
    """tokenizer.json sits next to the graph, or one level up for `onnx/model.onnx` layouts."""
    for folder in (graph.parent, graph.parent.parent):
        if (folder / "tokenizer.json").is_file():
            return folder / "tokenizer.json"
    raise OnnxModelError(f"no tokenizer.json next to {graph} or in {graph.parent.parent}")


def model_max_length(folder: Path) -> int | None:
    """The smallest sequence limit the model's config files declare, if any."""
    limits: list[int] = []
    for filename, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
        ("config.json", "max_position_embeddings"),
    ):
        path = folder / filename
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get(key)
        except (json.JSONDecodeError, AttributeError) as exc:
            raise OnnxModelError(f"{path} is not a JSON object: {exc}") from exc
        if isinstance(value, int | float) and 0 < value < _NO_LIMIT:
            limits.append(int(value))
    return min(limits) if limits else None


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """Truncate to `max_length`; padding is per batch (to its longest), set by `OnnxModel`."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise OnnxModelError(f"cannot read tokenizer {path}: {exc}") from exc
    tokenizer.enable_truncation(max_length=max_length)
    # Exports often ship fixed-length padding (e.g. 128); pad only to the longest in a batch.
    pad_id, pad_token = _pad_token(tokenizer)
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return tokenizer


def _pad_token(tokenizer: Tokenizer) -> tuple[int, str]:
    """The export's own pad token if it sets one, else the usual BERT/RoBERTa names, else id 0."""
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"]), str(tokenizer.padding["pad_token"])
    for token in ("[PAD]", "<pad>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id, token
    return 0, tokenizer.id_to_token(0) or "[PAD]"


def usable_cpus() -> int:
    """Cores this process may run on (respects container CPU sets), capped at 8."""
    from memory_dag.store.connection import process_cores

    return max(1, min(process_cores(), 8))


def create_session(graph: Path) -> onnxruntime.InferenceSession:
    """A CPU session using every usable core for one op at a time, without busy-waiting."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = usable_cpus()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle ORT threads spin by default; the store shares few cores with DuckDB and FAISS.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return onnxruntime.InferenceSession(
            str(graph), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own exception types for bad graphs
        raise OnnxModelError(f"cannot load ONNX graph {graph}: {exc}") from exc


@dataclass(frozen=True)
class Batch:
    """One model run: which inputs it covered, the first graph output, and the attention mask."""

    indices: list[int]
    output: np.ndarray
    attention_mask: np.ndarray


class OnnxModel:
    """A tokenizer plus an inference session, run in length-sorted batches."""

    def __init__(self, model: str | Path, max_length: int, batch_size: int = 32) -> None:
        self.files = resolve_model_files(model)
        limit = model_max_length(self.files.tokenizer.parent)
        self.max_length = min(max_length, limit) if limit else max_length
        self.batch_size = batch_size
        self.tokenizer = load_tokenizer(self.files.tokenizer, self.max_length)
        self.session = create_session(self.files.graph)
        self.input_names = [i.name for i in self.session.get_inputs()]
        unknown = sorted(set(self.input_names) - KNOWN_INPUTS)
        if unknown or "input_ids" not in self.input_names:
            raise OnnxModelError(
                f"{self.files.graph} declares inputs {self.input_names}; expected input_ids plus "
                "optionally attention_mask and token_type_ids"
            )
        self.output_shape = self.session.get_outputs()[0].shape

    def run(self, inputs: Sequence[str] | Sequence[tuple[str, str]]) -> Iterator[Batch]:
        """Tokenise and run `inputs` (texts or text pairs); yields batches in no fixed order.

        Inputs are sorted by character length so each batch pads to a similar length; a batch
        padded to its longest member wastes far less compute than one padded to a random one.
        """
        order = sorted(range(len(inputs)), key=lambda i: _char_length(inputs[i]))
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            encodings = self.tokenizer.encode_batch([inputs[i] for i in indices])
            arrays = token_arrays(encodings)
            feeds = {name: arrays[name] for name in self.input_names}
            try:
                output = np.asarray(self.session.run(None, feeds)[0])
            except Exception as exc:  # onnxruntime's own error types (bad ids, shapes, ...)
                raise OnnxModelError(f"running {self.files.graph} failed: {exc}") from exc
            yield Batch(indices=indices, output=output, attention_mask=arrays["attention_mask"])


def token_arrays(encodings: Sequence[Encoding]) -> dict[str, np.ndarray]:
    """int64 arrays for every input a BERT-like graph may declare (all padded alike)."""
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def _char_length(item: str | tuple[str, str]) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])
