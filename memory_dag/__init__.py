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

from memory_dag.config import Settings
from memory_dag.index.search import SearchFilters, SearchHit, search
from memory_dag.memory import Memory
from memory_dag.pipeline import run_all as ingest
from memory_dag.reports import StageReport
from memory_dag.store.connection import open_store

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
