"""The warm-up of a worker process: it loads what a first run would, and never fails the worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memory_dag.config import Settings
from memory_dag.embed.providers import EmbeddingError, get_provider
from memory_dag.warm_up import STAGE_MODULES, load_embedder_in_background, warm_up

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


CHUNKS_IN_A_COLD_PROCESS = """
import json, sys, threading
from pathlib import Path
from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
root = Path(sys.argv[1])
settings = Settings(workspace=root / "workspace", db_path=root / "memory.duckdb",
                    index_dir=root / "index", embedding_provider=sys.argv[2])
sync_files(settings)
seen = {}
for run in ("first", "again"):
    before = get_provider(settings)._wl is not None if sys.argv[2] == "wordllama" else None
    written = build_chunks(settings).counts["written"]
    loading = [t for t in threading.enumerate() if t.name == "load-embedder"]
    for thread in loading:
        thread.join()
    seen[run] = {"written": written, "loaded_before": before, "threads": len(loading)}
seen["loaded"] = get_provider(settings)._wl is not None if sys.argv[2] == "wordllama" else None
print(json.dumps(seen))
"""


def _chunks_in_a_cold_process(tmp_path: Path, workspace: Path, provider: str) -> dict:
    (tmp_path / "run").mkdir()
    workspace.rename(tmp_path / "run" / "workspace")
    out = subprocess.run(
        [sys.executable, "-c", CHUNKS_IN_A_COLD_PROCESS, str(tmp_path / "run"), provider],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_chunks_stage_loads_the_embedding_model_for_the_stages_after_it(
    tmp_path: Path, workspace: Path
) -> None:
    seen = _chunks_in_a_cold_process(tmp_path, workspace, "wordllama")
    assert seen["first"]["written"] > 0
    assert seen["first"]["loaded_before"] is False
    assert seen["first"]["threads"] == 1  # in the background: the stage does not wait for it
    assert seen["loaded"]
    # Nothing to chunk, nothing to embed after it: no load is started.
    assert seen["again"] == {"written": 0, "loaded_before": True, "threads": 0}


def test_a_provider_that_calls_a_server_is_not_loaded_by_the_chunks_stage(
    tmp_path: Path, workspace: Path
) -> None:
    seen = _chunks_in_a_cold_process(tmp_path, workspace, "openai")
    assert seen["first"]["written"] > 0
    assert seen["first"]["threads"] == 0  # no request is sent to a server nobody asked for yet


def test_a_model_that_cannot_load_in_the_background_is_left_for_the_stage_that_embeds(
    tmp_path: Path,
) -> None:
    settings = Settings(embedding_provider="onnx", embedding_model=str(tmp_path / "missing"))
    thread = load_embedder_in_background(settings)
    assert thread is not None
    thread.join()
    with pytest.raises(EmbeddingError):
        get_provider(settings).embed(["the stage's own error, where the run's user sees it"])
