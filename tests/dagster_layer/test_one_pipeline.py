"""One pipeline, whatever the entry point: the Dagster job (`memory-dag ingest`), the library
(`memory_dag.ingest(settings)`), `memory-dag ingest --no-dagster` and the package installed from
a wheel in a fresh virtual environment outside the checkout build the same store, table by
table (`tests/store_snapshot.py`), and the same search index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import polars as pl
import pytest

from memory_dag import Settings, ingest
from memory_dag.cli.main import main
from memory_dag.eval.locomo import write_workspace
from memory_dag.index.published import current_version
from tests.conftest import LOCOMO_DIR, write_jsonl
from tests.store_snapshot import differences, store_tables

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCOMO = LOCOMO_DIR / "26.json"
pytestmark = pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev data not available")


def build_workspace(root: Path) -> Path:
    """A LoCoMo conversation (facts, entities, a HIERARCHICAL summary), a note, an entry."""
    workspace = root / "workspace"
    write_workspace([LOCOMO], workspace)
    (workspace / "MEMORY.md").write_text("# Notes\n\nThe deploy runs on Fridays.\n")
    entry = workspace / "entries" / "trip" / "turns" / "user" / "t1.md"
    entry.parent.mkdir(parents=True)
    entry.write_text("---\nrole: user\n---\nI am planning a trip to Kyoto in April.\n")
    write_jsonl(
        workspace / "sessions" / "chat" / "s1.jsonl",
        [{"role": "user", "name": "Dana", "content": "My sister Priya lives in Toronto."}],
    )
    return workspace


def store(root: Path, workspace: Path) -> Settings:
    return Settings(workspace=workspace, db_path=root / "memory.duckdb", index_dir=root / "index")


def args(settings: Settings) -> list[str]:
    paths = ["--workspace", str(settings.workspace), "--db", str(settings.db_path)]
    return [*paths, "--index-dir", str(settings.index_dir), "--json"]


def index_rows(settings: Settings) -> list[tuple]:
    """The published index's rows, by what they say (ids of facts are random)."""
    version = current_version(settings.index_dir)
    assert version is not None
    rows = pl.read_parquet(settings.index_dir / version / "rows.parquet")
    return sorted(rows.select("kind", "path", "start_line", "text", "conversation_id").rows())


@pytest.fixture(scope="module")
def through_dagster(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The store the Dagster job builds, as `memory-dag ingest` runs it."""
    root = tmp_path_factory.mktemp("one-pipeline")
    workspace = build_workspace(root)
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "data" / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    settings = store(root / "dagster", workspace)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(home))
        assert main(["ingest", *args(settings)]) == 0
    return settings


def test_the_library_builds_the_store_the_dagster_job_builds(
    through_dagster: Settings, tmp_path: Path
) -> None:
    library = store(tmp_path / "library", through_dagster.workspace)
    reports = {report.stage for report in ingest(library)}

    assert reports >= {"files", "chunks", "facts", "entities", "summaries", "embeddings"}
    tables = store_tables(library.db_path)
    for table in ("memories", "entities", "memory_entities", "relations", "history"):
        assert tables[table], table  # the derived memories are there, not just the chunks
    kinds = {row[1] for row in tables["memories"]}
    assert {"episode", "fact", "summary"} <= kinds
    assert differences(through_dagster.db_path, library.db_path) == {}
    assert index_rows(through_dagster) == index_rows(library)


def test_ingest_without_dagster_builds_the_same_store(
    through_dagster: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = store(tmp_path / "cli", through_dagster.workspace)
    capsys.readouterr()
    assert main(["ingest", "--no-dagster", *args(cli)]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]

    assert list(stages)[:5] == ["files", "chunks", "facts", "entities", "summaries"]
    assert differences(through_dagster.db_path, cli.db_path) == {}


@pytest.mark.slow
def test_the_wheel_outside_the_checkout_builds_the_same_store(
    through_dagster: Settings, tmp_path: Path
) -> None:
    """The package from a wheel, in a fresh venv run outside the checkout: no Dagster layer
    there, so `memory-dag ingest` runs the library pipeline. (The venv reuses this one's
    dependencies through a path file, so the test needs no network.)"""
    source = tmp_path / "source"  # a copy: building writes build/ beside the sources
    shutil.copytree(
        REPO_ROOT / "memory_dag",
        source / "memory_dag",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(wheels), str(source)],
        check=True,
        cwd=tmp_path,
    )
    [wheel] = wheels.glob("memory_dag-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # This environment's packages (but not its editable memory_dag) serve as dependencies.
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    outside = store(tmp_path / "wheel-store", through_dagster.workspace)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_DAG_", "PYTHON"))}
    done = subprocess.run(
        [venv / "bin" / "memory-dag", "ingest", *args(outside)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    located = subprocess.run(
        [python, "-c", "import memory_dag; print(memory_dag.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert located.startswith(site) and str(REPO_ROOT) not in located  # the wheel's copy

    assert differences(through_dagster.db_path, outside.db_path) == {}
    assert index_rows(through_dagster) == index_rows(outside)
