"""Stage 4 (step `indexes`): search documents + embeddings → a published FAISS + BM25 version,
and, built beside it, DuckDB's FTS index over `chunks` for people who query with SQL.

The index is republished only when the fingerprint of (model, documents) changed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory_dag import progress
from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.embed.providers import get_provider
from memory_dag.ids import digest
from memory_dag.index.chunks_fts import rebuild_chunks_fts, refresh_chunks_fts
from memory_dag.index.incremental import plan_change, publish_incremental
from memory_dag.index.published import (
    CATALOG_COLUMNS,
    FORMAT_VERSION,
    ROW_BATCH,
    StagedRows,
    discard_staged,
    publish_staged,
    read_manifest,
    stage_rows,
    stage_vectors,
)
from memory_dag.memories.journal import JOURNAL_SEQ_KEY
from memory_dag.parallel import release_workers
from memory_dag.reports import StageReport, StageTimer
from memory_dag.scope import store_users
from memory_dag.store.connection import (
    fetch_arrow,
    get_meta,
    listed,
    load_fts,
    open_store,
    registered,
    set_meta,
)

# ---------------------------------------------------------------------------------------------
# Stage 4: chunks + embeddings → published FAISS + BM25 index


#: The indexable documents: those embedded by the model (two parameters: provider, model).
_DOCUMENTS = (
    "FROM search_documents c WHERE c.hash IN "
    "(SELECT hash FROM embedding_cache WHERE provider = ? AND model = ?)"
)
_ROW_COLUMNS = (
    "c.id, c.kind, c.source, c.path, c.start_line, c.end_line, c.text, c.search_text, "
    "c.speaker, c.turn_ids, c.conversation_id, c.session_id, c.event_time, c.role, c.category, "
    "c.user_id, c.agent_id, c.importance, c.pinned, c.updated_at, c.hash"
)


@progress.tracked("search_index")
def build_search_index(
    settings: Settings, *, force: bool = False, incremental: bool = True
) -> StageReport:
    """Publish a new index version when chunks or the model changed since the live one: made
    from the live version when the change is small (`incremental.py`), else rebuilt."""
    report = StageReport("search_index")
    with StageTimer(report):
        provider = get_provider(settings)
        with open_store(settings.db_path) as con:
            # How many users the store names: readers of a store of several users must name
            # one (memory_dag/scope.py), and they read this count from the manifest.
            users = store_users(con)
            # The last live write folded into the store (`memories/fold.py`): readers add the
            # delta segment's later writes on top of this version.
            journal_seq = int(get_meta(con, JOURNAL_SEQ_KEY) or 0)
            fingerprint = digest(
                _index_fingerprint(con, provider.name, provider.model),
                f"users:{users}",
                f"journal:{journal_seq}",
            )
            live = read_manifest(settings.index_dir)
            if not force and live is not None and live.get("fingerprint") == fingerprint:
                report.skipped = True
                report.counts = {"rows": int(live["count"]), "dims": int(live["dims"])}
                return report
            # Rows and vectors come in two queries (one snapshot) and are matched by hash in
            # Arrow: sorting rows that carry their vectors made DuckDB move ~1 KB a row.
            con.execute("BEGIN TRANSACTION")
            model = [provider.name, provider.model]
            change = None
            if incremental and not force:  # a small change: the next version from the live one
                current = fetch_arrow(
                    con, f"SELECT c.id, c.hash, c.kind, c.path {_DOCUMENTS}", model
                )
                change = plan_change(
                    settings.index_dir,
                    current,
                    provider=provider.name,
                    model=provider.model,
                    dims=int(provider.dims),
                )
            # Lists as Arrow views, not bound lists (`store.connection.listed`: ~0.1 ms a value).
            only = "" if change is None else "AND c.id IN (SELECT value FROM index_added)"
            rows_query = (
                f"SELECT {_ROW_COLUMNS} {_DOCUMENTS} {only} "
                "ORDER BY c.conversation_id NULLS FIRST, c.path, c.start_line, c.id"
            )
            staged: StagedRows | None = None
            table: pa.Table | None = None
            with listed(con, "index_added", change.added if change is not None else []):
                if change is None:
                    # A rebuild needs all the memory it can get: the idle workers of the
                    # earlier stages go (`parallel.release_workers`).
                    release_workers()
                    # A rebuild streams its rows into the next version's folder as they come:
                    # every row's text held at once was ~1.5 GB at 1M rows.
                    batches = con.execute(rows_query, model).to_arrow_reader(ROW_BATCH)
                    staged = stage_rows(settings.index_dir, batches, hashes=True)
                    row_hashes = staged.hashes
                else:
                    table = fetch_arrow(con, rows_query, model)
                    row_hashes = table.column("hash")
            try:
                # A rebuild takes every document's vector; an increment only the added rows'.
                # They go straight into one matrix in row order, batch by batch: holding the
                # fetched column, its copy as a matrix and the reordered matrix at once cost
                # three times the vectors' size (3 GB at 1M rows of 256 floats).
                # The rows' own hashes as an Arrow view, not `search_documents` again: at 300k
                # rows its scan beside the vectors' took 0.27 GB more.
                with registered(con, "index_hashes", pa.table({"value": row_hashes})):
                    reader = con.execute(
                        f"SELECT hash, embedding::FLOAT[{int(provider.dims)}] AS embedding "
                        "FROM embedding_cache WHERE provider = ? AND model = ? "
                        "AND hash IN (SELECT value FROM index_hashes)",
                        model,
                    ).to_arrow_reader(VECTOR_BATCH_ROWS)
                    vectors = _vectors_in_row_order(row_hashes, reader, provider.dims)
                total_chunks = con.execute("SELECT count(*) FROM search_documents").fetchone()[0]
                catalog = fetch_arrow(
                    con,
                    f"SELECT {', '.join(CATALOG_COLUMNS)} FROM memories WHERE kind <> 'episode' "
                    "ORDER BY id",
                )
                con.execute("COMMIT")
            except BaseException:
                if staged is not None:
                    discard_staged(staged)
                raise
        published = {
            "fingerprint": fingerprint,
            "store_users": users,
            "catalog": catalog,
            "journal_seq": journal_seq,
        }
        if table is not None and change is not None:
            manifest = publish_incremental(settings.index_dir, change, table, vectors, **published)
            step = manifest["incremental"]
            report.notes.append(
                f"incremental: {step['added']} rows added, {step['removed']} removed, "
                f"{step['kept']} kept from {step['base']}"
            )
            indexed = int(manifest["count"])
        else:
            assert staged is not None
            try:
                stage_vectors(staged, vectors)
            except BaseException:
                discard_staged(staged)
                raise
            del vectors  # FAISS reads them back from the staging folder
            manifest = publish_staged(
                settings.index_dir,
                staged,
                provider=provider.name,
                model=provider.model,
                **published,
            )
            indexed = staged.count
        not_embedded = int(total_chunks) - indexed
        if not_embedded:
            report.notes.append(f"{not_embedded} documents have no embedding yet: not indexed")
        report.counts = {
            "rows": int(manifest["count"]),
            "dims": int(manifest["dims"]),
            "not_embedded": not_embedded,
            "incremental": int(change is not None),
        }
        report.notes.append(f"version {manifest['version']}, faiss {manifest['faiss_type']}")
    return report


def _index_fingerprint(con: Any, provider: str, model: str) -> str:
    return digest(str(FORMAT_VERSION), provider, model, rows_fingerprint(con, "search_documents"))


def _chunks_fingerprint(con: Any) -> str:
    return rows_fingerprint(con, "chunks")


#: The relations whose (id, hash) pairs `rows_fingerprint` reads (a name goes into its SQL).
_FINGERPRINTED = frozenset({"search_documents", "chunks"})


def rows_fingerprint(con: Any, relation: str) -> str:
    """What `relation`'s (id, hash) pairs are, as one string: their count and the XOR of each
    pair's md5. The same set of pairs gives the same string in any order (ids are unique);
    a pair added, removed or changed gives another ("id:hash" names one pair: an id may hold
    a ":", a hash, hex, none). Nothing is sorted: the md5 of every pair joined in id order
    took 1.9-2.6 s at 1M rows, on every run of the index step."""
    if relation not in _FINGERPRINTED:
        raise ValueError(f"no fingerprint of {relation!r}: one of {sorted(_FINGERPRINTED)}")
    count, folded = con.execute(
        f"SELECT count(*), bit_xor(md5_number(id || ':' || hash)) FROM {relation}"
    ).fetchone()
    return f"{count}:{folded if folded is not None else 0}"


#: Embeddings read from DuckDB at a time while the index's matrix is filled.
VECTOR_BATCH_ROWS = 65_536


def _vectors_in_row_order(
    row_hashes: pa.ChunkedArray | pa.Array, batches: pa.RecordBatchReader, dims: int
) -> np.ndarray:
    """The (rows × dims) float32 matrix whose row i is the embedding of `row_hashes[i]`, filled
    from (hash, FLOAT[dims] embedding) batches; rows may share a hash (identical texts)."""
    hashes = row_hashes.combine_chunks() if isinstance(row_hashes, pa.ChunkedArray) else row_hashes
    vectors = np.empty((len(hashes), dims), dtype=np.float32)
    filled = np.zeros(len(hashes), dtype=bool)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        position = pc.fill_null(pc.index_in(hashes, value_set=batch.column("hash")), -1)
        position = position.to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(position >= 0)
        found = position[rows]
        embeddings = batch.column("embedding").flatten().to_numpy().reshape(batch.num_rows, dims)
        vectors[rows] = embeddings[found]
        filled[rows] = True
    if not filled.all():  # the documents were chosen by their embedding: not expected
        raise RuntimeError(f"{int((~filled).sum())} index rows have no embedding")
    return vectors


# ---------------------------------------------------------------------------------------------
# Stage 5: DuckDB full-text index over chunks, for people who query with SQL


@progress.tracked("chunks_fts")
def build_fts_index(
    settings: Settings, *, force: bool = False, background: bool = False
) -> StageReport:
    """(Re)build DuckDB's FTS index on `chunks` so `fts_main_chunks.match_bm25` works in SQL.

    `background`: the build itself (not the check whether it is needed) runs at a lower
    priority, beside the search index (see `build_indexes`)."""
    report = StageReport("chunks_fts")
    with StageTimer(report), open_store(settings.db_path) as con:
        how = load_fts(con)
        fingerprint = _chunks_fingerprint(con)
        if not force and get_meta(con, "fts_fingerprint") == fingerprint:
            report.skipped = True
            return report
        rows = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
        if background:
            _lower_this_threads_priority()
        if force:  # everything made again by the extension itself, its macros included
            rebuild_chunks_fts(con)
            done = "rebuilt by the extension"
        else:  # in place after a small change, else whole (`chunks_fts.py`)
            done = refresh_chunks_fts(con)
        set_meta(con, "fts_fingerprint", fingerprint)
        report.counts = {
            "rows": int(rows),
            "incremental": int(done.startswith("updated")),
            "beside_search_index": int(background),  # else after it: the step takes both
        }
        report.notes.append(f"{done}; fts extension loaded from {how}")
    return report


# ---------------------------------------------------------------------------------------------


def refresh_search_index(settings: Settings, *, incremental: bool = True) -> list[StageReport]:
    """Embed what is missing, then publish the index: a write elsewhere becomes searchable.
    `incremental=False`: rebuild rather than add to the live version (the maintenance jobs,
    which run at night, so BM25 statistics and IVF lists are made fresh then)."""
    return [embed_chunks(settings), build_search_index(settings, incremental=incremental)]


def build_indexes(
    settings: Settings,
    *,
    force: bool = False,
    search_index: bool = True,
    fts: bool = True,
    settle: bool = False,
) -> Iterator[StageReport]:
    """The search index and DuckDB's FTS index, built side by side; reports as they finish.

    DuckDB fills its FTS index in C++, without holding the GIL, so it can run next to the
    FAISS + BM25 build. The FTS build runs at a lower priority, so that the search index, which
    agents are waiting for, is published about as soon as when it is built alone. Above
    `FTS_BESIDE_MAX_CHUNKS` it runs after the search index instead, for memory. The search
    index is reported first; a failure of one build beside the other does not stop it.

    `settle`: this is the last stage of a run of every stage; when both builds succeed and
    nothing wrote the store meanwhile, record that the graph settled (`graph_state`), so the
    next run with nothing new skips every stage after the files.
    """
    from memory_dag.graph_state import record_settled, settle_token

    token = settle_token(settings) if settle and search_index and fts else None
    beside = fts and search_index and _chunk_count(settings) <= FTS_BESIDE_MAX_CHUNKS
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fts-build") as threads:
        fts_build = (
            threads.submit(build_fts_index, settings, force=force, background=True)
            if beside
            else None
        )
        if search_index:
            yield build_search_index(settings, force=force)
        if fts_build is not None:
            yield fts_build.result()
        elif fts:
            yield build_fts_index(settings, force=force)
    if token is not None:
        record_settled(settings, token)


#: Above this many chunks the FTS build waits for the search index instead of running beside
#: it: its memory (DuckDB's, outside the memory limit: ~2.3 KB a chunk, 0.7 GB at 300k) would
#: come on top of the FAISS + BM25 build's, the step's peak (~2 GB more at 1M chunks).
FTS_BESIDE_MAX_CHUNKS = 250_000


def _chunk_count(settings: Settings) -> int:
    with open_store(settings.db_path) as con:
        return int(con.execute("SELECT count(*) FROM chunks").fetchone()[0])


#: Nice value of the FTS build beside the search index: it takes a smaller share of a busy
#: machine (at 19 it all but stopped whenever other processes ran, and the step waits for it).
BACKGROUND_NICE = 5


def _lower_this_threads_priority() -> None:
    if sys.platform.startswith("linux"):  # Linux gives each thread its own nice value
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
