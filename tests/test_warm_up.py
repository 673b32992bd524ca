"""The warm-up of a worker process: it loads what a first run would, and never fails the worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memory_dag.config import Settings
from memory_dag.embed.providers import EmbeddingError, get_provider
from memory_dag.warm_up import STAGE_MODULES, warm_up

REPO = Path(__file__).resolve().parents[1]

COLD_PROCESS = """
import json, sys
from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.warm_up import STAGE_MODULES, warm_up
before = [name for name in STAGE_MODULES if name in sys.modules]
warm_up(Settings.load())
print(json.dumps({
    "before": before,
    "after": [name for name in STAGE_MODULES if name in sys.modules],
    "libraries": [name for name in ("polars", "pyarrow", "duckdb", "faiss") if name in sys.modules],
    "model_loaded": get_provider(Settings.load())._wl is not None,
}))
"""


def test_a_cold_process_has_the_stage_modules_and_the_model_loaded_after_warm_up() -> None:
    out = subprocess.run(
        [sys.executable, "-c", COLD_PROCESS], cwd=REPO, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == []  # the import of the library alone loads no stage
    assert seen["after"] == list(STAGE_MODULES)
    assert seen["libraries"] == ["polars", "pyarrow", "duckdb", "faiss"]
    assert seen["model_loaded"]


def test_a_model_that_cannot_load_is_left_for_the_run_to_report(tmp_path: Path) -> None:
    settings = Settings(embedding_provider="onnx", embedding_model=str(tmp_path / "missing"))
    assert warm_up(settings) >= 0  # the worker starts
    with pytest.raises(EmbeddingError):
        get_provider(settings).embed(["the run's own step fails, with the provider's error"])
