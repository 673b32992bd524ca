"""The code location loads without the data libraries.

The daemon, the webserver's code server and every run worker import
`memory_dag.definitions` before doing anything; a run a sensor asks for cannot start before
that import ends. Polars, PyArrow and NumPy cost ~0.5 s of it and are only needed once a step
runs, so the definitions, sensors and schedules import the library where it is used.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("polars", "pyarrow", "numpy", "faiss", "wordllama", "tiktoken", "great_expectations")


def heavy_modules_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after running `code`."""
    report = f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    probe = f"{code}\nimport json, sys\n{report}\n"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_definitions_import_no_data_library() -> None:
    code = "import memory_dag.definitions as d\nassert d.defs is not None"
    assert heavy_modules_after(code) == []


def test_cli_start_imports_no_data_library() -> None:
    """`memory-dag --help` (and the parse every command makes) stays light too."""
    code = "from memory_dag.cli.main import build_parser\nbuild_parser()"
    assert heavy_modules_after(code) == []
