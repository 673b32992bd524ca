"""Settings for a memory store: where things live and how they are built and searched.

One pydantic model, filled from keyword arguments, then `MEMORY_DAG_*` environment variables,
then the defaults below. The defaults run fully offline (WordLlama embeddings, no LLM).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

EmbeddingProviderName = Literal["wordllama", "onnx", "openai"]

ENV_PREFIX = "MEMORY_DAG_"

#: Environment variable → settings field. Documented in README "Configuration".
ENV_FIELDS: dict[str, str] = {
    "WORKSPACE": "workspace",
    "DB": "db_path",
    "INDEX_DIR": "index_dir",
    "EMBEDDING_PROVIDER": "embedding_provider",
    "EMBEDDING_MODEL": "embedding_model",
    "EMBEDDING_BASE_URL": "embedding_base_url",
    "LLM_BASE_URL": "llm_base_url",
    "LLM_MODEL": "llm_model",
    "LLM_API_KEY": "llm_api_key",
    "LLM_TIMEOUT": "llm_timeout",
    "WORKSPACE_EXTRA_ROOTS": "workspace_extra_roots",
    "SQL_EXTERNAL_ACCESS": "sql_external_access",
    "COMPUTE_THREADS": "compute_threads",
}


class Settings(BaseModel):
    """Everything a run needs to know; safe to log (the API key is excluded from dumps)."""

    workspace: Path = Field(Path("data/workspace"), description="Folder with notes and sessions")
    db_path: Path = Field(Path("data/memory.duckdb"), description="The DuckDB memory store")
    #: FAISS and BM25 index files; by default beside the store (`default_index_dir`).
    index_dir: Path = Field(None, description="FAISS and BM25 index files")  # type: ignore[assignment]
    #: Folders outside the workspace that its symlinks may lead to (all others are refused).
    workspace_extra_roots: list[Path] = Field(default_factory=list)
    #: Let `memory-dag sql` read and write files (DuckDB's external access): trusted use only.
    sql_external_access: bool = False

    embedding_provider: EmbeddingProviderName = "wordllama"
    #: Provider-specific model name: a WordLlama config ("l2_supercat"), an ONNX hub name or
    #: local folder, or an OpenAI embedding model. Empty means the provider's default.
    embedding_model: str = ""
    embedding_base_url: str | None = None
    embedding_batch_size: int = 512

    chunk_tokens: int = 400
    chunk_overlap: int = 80
    #: Turns per transcript chunk. 1 (the default) makes every search hit one turn, which is
    #: what an agent wants to cite; seed 002 packs turns into 400-token chunks instead.
    session_chunk_turns: int = 1

    # Hybrid search (docs/retrieval.md). Seed 002 blends 0.7·vector + 0.3·text; on LoCoMo
    # standardised (z-score) fusion with equal weights and the context boosts below ranks
    # far better, so that is the default and the seed's blend remains an option.
    fusion: Literal["zscore", "blend", "rrf"] = "zscore"
    vector_weight: float = 0.5
    text_weight: float = 0.5
    candidate_multiplier: int = 4
    max_results: int = 6
    min_score: float = 0.35
    #: Strip participants' names from transcript text and queries; boost the named speaker.
    speaker_aware: bool = True
    speaker_boost: float = 5.0
    #: + boost × the best score of the chunk before / after in the same file.
    neighbour_boost: float = 0.35
    #: + boost × the standardised best score of the chunk's session (file).
    session_boost: float = 0.5

    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: str | None = Field(None, exclude=True, repr=False)
    llm_timeout: float = 60.0

    #: BLAS / OpenMP threads of a process that serves reads (`Memory`, `memory-dag serve`;
    #: `compute_threads.py`): 1, as a search's small products only wait for more; 0 leaves
    #: the process's pools as they are.
    compute_threads: int = 1

    @model_validator(mode="after")
    def _index_beside_store(self) -> Settings:
        if self.index_dir is None:
            self.index_dir = default_index_dir(self.db_path)
        return self

    @classmethod
    def load(cls, **overrides: object) -> Settings:
        """Build settings from env vars, with explicit keyword overrides winning (None = unset)."""
        values: dict[str, object] = {}
        for env_name, field in ENV_FIELDS.items():
            raw = os.environ.get(ENV_PREFIX + env_name)
            if raw:
                values[field] = raw
        if isinstance(values.get("workspace_extra_roots"), str):
            roots = str(values["workspace_extra_roots"]).split(os.pathsep)
            values["workspace_extra_roots"] = [root for root in roots if root]
        if "llm_api_key" not in values and os.environ.get("OPENAI_API_KEY"):
            values["llm_api_key"] = os.environ["OPENAI_API_KEY"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    @property
    def llm_configured(self) -> bool:
        return bool(self.llm_base_url or self.llm_api_key) and bool(self.llm_model)


def default_index_dir(db_path: Path) -> Path:
    """Where a store's index lives unless told otherwise: beside the store, never shared.

    `data/memory.duckdb` → `data/index/` (the default layout); any other `NAME.duckdb` →
    `NAME.index/` beside it, so two stores in one folder never share an index.
    """
    db_path = Path(db_path)
    if db_path.name == "memory.duckdb":
        return db_path.with_name("index")
    return db_path.with_name(db_path.stem + ".index")
