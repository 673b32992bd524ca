"""memory-dag: long-term memory for LLM agents over DuckDB, FAISS and BM25.

    from memory_dag import Settings, ingest, search

    settings = Settings.load()          # MEMORY_DAG_* environment variables, then defaults
    ingest(settings)                    # every pipeline stage, incrementally
    hits = search("pizza", settings=settings, conversation="demo")

The Dagster assets in `assets/` call the same functions.
"""

from memory_dag.config import Settings
from memory_dag.index.search import SearchFilters, SearchHit, search
from memory_dag.pipeline import run_all as ingest
from memory_dag.reports import StageReport
from memory_dag.store.connection import open_store

__all__ = [
    "SearchFilters",
    "SearchHit",
    "Settings",
    "StageReport",
    "ingest",
    "open_store",
    "search",
]
