"""Stage 3 (asset `chunk_embeddings`): search documents → `embedding_cache`.

Keyed by (provider, model, text hash): identical text is embedded once, across files and
runs; a model change leads to a clean re-embed under the new key.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.reports import StageReport, StageTimer
from memory_dag.store.connection import (
    fetch_arrow,
    get_meta,
    insert_arrow,
    open_store,
    set_meta,
)

#: Embeddings are written to the store in groups of about this many rows.
EMBED_FLUSH_ROWS = 50_000


def _now() -> datetime:
    return datetime.now(UTC)


_TS = pa.timestamp("us", tz="UTC")


@progress.tracked("embeddings")
def embed_chunks(settings: Settings) -> StageReport:
    """Embed every chunk text the cache does not hold yet for the configured model.

    The cache is keyed by (provider, model, text hash): identical text is embedded once,
    across files and runs. Switching model is recorded in `store_meta` and leads to a full
    re-embed under the new key; the index only ever reads vectors of the current model.
    """
    report = StageReport("embeddings")
    with StageTimer(report):
        provider = get_provider(settings)
        with open_store(settings.db_path) as con:
            previous = (get_meta(con, "embedding_provider"), get_meta(con, "embedding_model"))
            missing = fetch_arrow(
                con,
                """
                SELECT DISTINCT c.hash, c.search_text FROM search_documents c
                WHERE NOT EXISTS (
                    SELECT 1 FROM embedding_cache e
                    WHERE e.provider = ? AND e.model = ? AND e.hash = c.hash)
                """,
                [provider.name, provider.model],
            )
        if previous[1] is not None and previous != (provider.name, provider.model):
            report.notes.append(
                f"embedding model changed from {previous[0]}/{previous[1]} to "
                f"{provider.name}/{provider.model}: every chunk is embedded again"
            )
        # Texts become Python strings a batch at a time: all of them at once were a second
        # copy of every text (~1 GB at 1M chunks) beside the Arrow column.
        hashes, texts = missing.column("hash"), missing.column("search_text")
        batch = max(1, settings.embedding_batch_size) * 8
        progress.set_total(len(texts), "texts")
        pending: list[pa.Table] = []
        # Vectors are written by a second thread while the next texts are embedded (DuckDB
        # lets go of the GIL while it writes): at 100k chunks that hides ~2 s of writing.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-writer") as writer:
            writes: list[Future[int]] = []

            def flush() -> None:
                if pending:
                    rows = pa.concat_tables(pending)
                    writes.append(writer.submit(_write_embeddings, settings.db_path, rows))
                    pending.clear()

            for start in range(0, len(texts), batch):
                vectors = provider.embed(texts.slice(start, batch).to_pylist())
                pending.append(
                    pa.table(
                        {
                            "provider": pa.array([provider.name] * len(vectors)),
                            "model": pa.array([provider.model] * len(vectors)),
                            "hash": hashes.slice(start, batch),
                            "dims": pa.array([provider.dims] * len(vectors), type=pa.int32()),
                            "embedding": _vectors_to_arrow(vectors),
                            "created_at": pa.array([_now()] * len(vectors), type=_TS),
                        }
                    )
                )
                if sum(t.num_rows for t in pending) >= EMBED_FLUSH_ROWS:
                    flush()
                progress.advance(len(vectors))
            flush()
            written = sum(write.result() for write in writes)
        with open_store(settings.db_path) as con:
            set_meta(con, "embedding_provider", provider.name)
            set_meta(con, "embedding_model", provider.model)
            set_meta(con, "embedding_dims", str(provider.dims))
            cached = con.execute(
                "SELECT count(*) FROM embedding_cache WHERE provider = ? AND model = ?",
                [provider.name, provider.model],
            ).fetchone()[0]
        report.counts = {"embedded": written, "cached": int(cached), "dims": provider.dims}
        report.notes.append(f"model {provider.name}/{provider.model}, {provider.dims} dims")
    return report


def _write_embeddings(db_path: Path, rows: pa.Table) -> int:
    """One group of vectors in one short connection: each group that is written stays
    written if the run stops later (one connection per batch made the stage quadratic, as
    every close checkpoints the growing table)."""
    with open_store(db_path) as con:
        return insert_arrow(con, "embedding_cache", rows)


def _vectors_to_arrow(vectors: np.ndarray) -> pa.Array:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(vectors.reshape(-1)))
