"""The one Dagster resource: where the memory store lives and how it is built.

Unset fields fall back to `MEMORY_DAG_*` environment variables, then to the library defaults
(`memory_dag.config.Settings`), so `dagster dev`, the CLI and tests share one configuration.
"""

from __future__ import annotations

import dagster as dg

from memory_dag.config import Settings


class MemoryStoreResource(dg.ConfigurableResource):
    """Paths and model choices of the memory store (see README, "Configuration")."""

    workspace: str | None = None
    db_path: str | None = None
    index_dir: str | None = None
    embedding_provider: str | None = None
    embedding_model: str | None = None
    #: Show progress bars on stderr (the CLI turns this on; the UI shows metadata instead).
    progress: bool = False

    def settings(self) -> Settings:
        return Settings.load(
            workspace=self.workspace,
            db_path=self.db_path,
            index_dir=self.index_dir,
            embedding_provider=self.embedding_provider,
            embedding_model=self.embedding_model,
        )


class RebuildConfig(dg.Config):
    """`force: true` re-reads, re-chunks and re-indexes everything (the reindex job sets it)."""

    force: bool = False
