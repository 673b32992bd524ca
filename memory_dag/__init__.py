"""memory-dag: long-term memory for LLM agents over DuckDB, FAISS and BM25.

    from memory_dag import Memory

    m = Memory()                        # MEMORY_DAG_* environment variables, then defaults
    m.add([{"role": "user", "content": "I moved to Lisbon"}], user_id="sam")
    m.search("where does Sam live?", user_id="sam")

    from memory_dag import Settings, ingest, search

    settings = Settings.load()
    ingest(settings)                    # every pipeline stage, incrementally
    hits = search("pizza", settings=settings, conversation="demo")

The command line, the service and the Dagster assets call the same functions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memory_dag.config import Settings
    from memory_dag.index.search import SearchFilters, SearchHit, search
    from memory_dag.memory import Memory
    from memory_dag.reports import StageReport
    from memory_dag.store.connection import open_store

#: Each name is imported when first used: the command line and the Dagster code location
#: import this package, and the search stack (FAISS, SciPy, Polars) costs ~1.5 s to import.
_EXPORTS = {
    "Memory": ("memory_dag.memory", "Memory"),
    "SearchFilters": ("memory_dag.index.search", "SearchFilters"),
    "SearchHit": ("memory_dag.index.search", "SearchHit"),
    "Settings": ("memory_dag.config", "Settings"),
    "StageReport": ("memory_dag.reports", "StageReport"),
    "open_store": ("memory_dag.store.connection", "open_store"),
    "search": ("memory_dag.index.search", "search"),
}

__all__ = [
    "Memory",
    "SearchFilters",
    "SearchHit",
    "Settings",
    "StageReport",
    "ingest",
    "open_store",
    "search",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'memory_dag' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


# The subpackage `memory_dag.ingest` is imported first, so that this function, not the
# subpackage, is what `memory_dag.ingest` names (importing a submodule sets its parent's
# attribute only the first time).
importlib.import_module("memory_dag.ingest")


def ingest(settings: Settings, **options: Any) -> list[StageReport]:
    """Every pipeline stage, incrementally (`memory_dag.pipeline.run_all`)."""
    from memory_dag.pipeline import run_all

    return run_all(settings, **options)
