"""A new index version made from the live one and a small change, instead of a rebuild.

A sensor run after one new session file changes a few dozen of 100k rows (the turns, the
conversation's facts and summary), yet a rebuild re-reads, re-tokenizes and re-indexes all of
them (~10 s at 100k). When the rows that differ from the live version (by id and content
hash, `row_hashes.parquet` beside its rows) are at most `SMALL_CHANGE` of it, the index step
writes the next version from the live one instead: its rows less the removed ones, the new
rows appended (every chunk of a file that changed, so a file's chunks stay one run in line
order), their vectors, and BM25 postings updated in place. It is published like a rebuild (a
whole new folder, then CURRENT swapped): readers and the delta overlay see no difference.

What differs from a rebuild of the same rows (searches find the same rows under the same
filters; scores can differ slightly):
- row order: appended rows come last, not in (conversation, path, line) order;
- BM25: every posting's idf is recomputed for the new row count and document frequencies, but
  the length normalisation keeps the live version's mean document length;
- IVF (above 20k rows): the new vectors go into the live version's trained lists (the
  removed ones are taken out, the others keep their lists), not into lists trained again.
`MAX_INCREMENTS` versions in a row are made this way at most; then, and for a large change, a
forced run (`reindex_job`), another model, or a maintenance job (the nightly schedule's, which
republish with `incremental=False`), the index is rebuilt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from memory_dag.index.faiss_import import faiss
from memory_dag.index.published import (
    CATALOG_FILE,
    CHUNK_KINDS,
    FORMAT_VERSION,
    HASHES_FILE,
    ROW_SCHEMA,
    install_version,
    new_staging,
)
from memory_dag.index.search_text import bm25_documents
from memory_dag.index.text_index import K1, B, TextIndex, tokenize_corpus
from memory_dag.index.vector_index import build_faiss, index_type_for, load_faiss, save_faiss

#: At most this share of the live version's rows may differ for an incremental version.
SMALL_CHANGE = 0.05
#: Incremental versions in a row before the index is rebuilt (BM25 lengths, IVF lists).
MAX_INCREMENTS = 24


@dataclass
class IndexChange:
    """What separates the store's documents from the live version's rows."""

    base: Path
    manifest: dict[str, Any]
    #: Row numbers of the live version that go.
    removed: np.ndarray
    #: Ids of the store's documents to append.
    added: list[str]


def plan_change(
    index_dir: Path, current: pa.Table, *, provider: str, model: str, dims: int
) -> IndexChange | None:
    """The change to apply to the live version, or None when a rebuild is due (no live
    version, another model or format, no hashes, too many increments, a large change).

    `current`: the store's indexable documents as (id, hash, kind, path)."""
    name = (index_dir / "CURRENT").read_text().strip() if (index_dir / "CURRENT").exists() else ""
    base = index_dir / name
    if not name or not (base / HASHES_FILE).exists():
        return None
    manifest = json.loads((base / "manifest.json").read_text())
    same = (manifest.get("format"), manifest.get("provider"), manifest.get("model")) == (
        FORMAT_VERSION,
        provider,
        model,
    )
    if not same or int(manifest.get("dims") or 0) != dims or not dims:
        return None
    if int(manifest.get("increments", 0)) >= MAX_INCREMENTS:
        return None
    live = pq.read_table(base / HASHES_FILE)
    rows = pq.read_table(base / "rows.parquet", columns=["kind", "path"])
    old = pl.DataFrame(
        {
            "id": live.column("id"),
            "hash": live.column("hash"),
            "kind": rows.column("kind"),
            "path": rows.column("path"),
        }
    ).with_row_index("row")
    new = pl.from_arrow(current.select(["id", "hash", "kind", "path"]))
    assert isinstance(new, pl.DataFrame)
    gone = old.join(new, on=["id", "hash"], how="anti")
    fresh = new.join(old, on=["id", "hash"], how="anti")
    # A file whose chunks changed is taken out and put back whole (its chunks stay one run).
    touched = (
        pl.concat([gone.select("kind", "path"), fresh.select("kind", "path")])
        .filter(pl.col("kind").is_in(list(CHUNK_KINDS)) & pl.col("path").is_not_null())
        .get_column("path")
        .unique()
    )
    # Each Series as one list (`implode`): what `is_in` looks each value up in.
    removed = old.filter(
        pl.col("row").is_in(gone.get_column("row").implode())
        | (pl.col("kind").is_in(list(CHUNK_KINDS)) & pl.col("path").is_in(touched.implode()))
    ).get_column("row")
    added = new.filter(
        pl.col("id").is_in(fresh.get_column("id").implode())
        | (pl.col("kind").is_in(list(CHUNK_KINDS)) & pl.col("path").is_in(touched.implode()))
    ).get_column("id")
    if len(removed) + len(added) > SMALL_CHANGE * max(old.height, 1):
        return None
    return IndexChange(
        base, manifest, removed.to_numpy().astype(np.int64), added.cast(pl.String).to_list()
    )


def publish_incremental(
    index_dir: Path,
    change: IndexChange,
    added: pa.Table,
    vectors: np.ndarray,
    *,
    fingerprint: str,
    store_users: int | None,
    catalog: pa.Table | None,
    journal_seq: int,
) -> dict[str, Any]:
    """Write and publish the next version: the live one with `change` applied. `added` holds
    the rows to append (ROW_SCHEMA columns and `hash`), `vectors` their embeddings."""
    base = change.base
    live_rows = pq.ParquetFile(base / "rows.parquet")
    keep = np.ones(live_rows.metadata.num_rows, dtype=bool)
    keep[change.removed] = False
    kept = int(keep.sum())
    # `added` comes in the rebuild's order (conversation, path, line): a file's chunks in a run.
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    hashes = pa.concat_arrays(
        [
            pq.read_table(base / HASHES_FILE)
            .column("hash")
            .combine_chunks()
            .filter(pa.array(keep)),
            added.column("hash").combine_chunks(),
        ]
    )
    appended = added.drop_columns(["hash"])
    for column in ROW_SCHEMA.names:
        if column not in appended.column_names:
            appended = appended.append_column(
                column, pa.nulls(appended.num_rows, ROW_SCHEMA.field(column).type)
            )
    count = kept + appended.num_rows
    staging, name = new_staging(index_dir)
    try:
        # Each part of the version is written and let go before the next is made: at 1M rows
        # the rows with their texts, the vectors, the IVF index and the BM25 postings held
        # at once took 8.1 GB, for one new session.
        ids = _write_rows(
            live_rows, keep, appended.select(ROW_SCHEMA.names).cast(ROW_SCHEMA), staging
        )
        live_rows.close()
        pq.write_table(pa.table({"id": ids, "hash": hashes}), staging / HASHES_FILE)
        del ids, hashes
        # One matrix, filled from the live file read in place (loading it, masking it and
        # concatenating held three copies at once), straight into the new file (a matrix in
        # memory, saved after, held every vector once more and copied them all again).
        live = np.load(base / "vectors.npy", mmap_mode="r")
        all_vectors = np.lib.format.open_memmap(
            staging / "vectors.npy", mode="w+", dtype=np.float32, shape=(count, live.shape[1])
        )
        copy_kept_rows(live, keep, all_vectors[:kept])
        all_vectors[kept:] = vectors
        all_vectors.flush()
        del live
        faiss_type = index_type_for(count)
        if faiss_type == "ivf" and change.manifest.get("faiss_type") == "ivf":
            del all_vectors  # the live lists take the new vectors alone
            index = _ivf_changed(base / "vectors.faiss", change.removed, keep, vectors)
        else:
            index = build_faiss(all_vectors)
            del all_vectors
        save_faiss(index, staging / "vectors.faiss")
        del index
        text = _text_index(base, change.manifest, keep, appended)
        text.save(staging / "bm25")
        del text
        if catalog is not None:
            pq.write_table(catalog, staging / CATALOG_FILE)
        manifest = {
            **change.manifest,
            "version": name,
            "count": count,
            "faiss_type": faiss_type,
            "fingerprint": fingerprint,
            "store_users": store_users,
            "journal_seq": int(journal_seq),
            "increments": int(change.manifest.get("increments", 0)) + 1,
            "incremental": {
                "base": base.name,
                "removed": int(len(change.removed)),
                "added": int(appended.num_rows),
                "kept": kept,
            },
        }
        install_version(index_dir, staging, name, manifest)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def copy_kept_rows(source: np.ndarray, keep: np.ndarray, out: np.ndarray) -> None:
    """`np.compress(keep, source, axis=0, out=out)`, copied a run of kept rows at a time.

    An increment keeps almost every row, so the kept rows are a few long runs: each is one
    block copy, read from the memory-mapped file in order (300k rows of 256 floats: 0.06 s,
    where `np.compress` took 0.8-1.6 s, a row at a time)."""
    edges = np.diff(np.concatenate([[0], keep.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    kept = int((ends - starts).sum())
    if kept != len(out):
        raise ValueError(f"{len(out)} output rows for {kept} kept")
    at = 0
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        out[at : at + end - start] = source[start:end]
        at += end - start


def _write_rows(
    live: pq.ParquetFile, keep: np.ndarray, appended: pa.Table, staging: Path
) -> pa.ChunkedArray:
    """The live rows `keep` keeps, then `appended`, streamed a batch at a time into the
    staging folder's `rows.parquet` (in row order); returns their ids."""
    ids: list[pa.Array] = []
    start = 0
    with pq.ParquetWriter(staging / "rows.parquet", ROW_SCHEMA) as writer:
        for batch in live.iter_batches():
            mask = keep[start : start + batch.num_rows]
            start += batch.num_rows
            part = pa.Table.from_batches([batch])
            if not mask.all():  # most batches are kept whole: filtering copied every text
                part = part.filter(pa.array(mask))
            part = part.cast(ROW_SCHEMA)
            writer.write_table(part)
            ids.extend(part.column("id").chunks)
        writer.write_table(appended)
        ids.extend(appended.column("id").chunks)
    return pa.chunked_array(ids, type=ROW_SCHEMA.field("id").type)


def _ivf_changed(
    path: Path, removed: np.ndarray, keep: np.ndarray, added: np.ndarray
) -> faiss.Index:
    """The live IVF index with the removed rows taken out of their lists, every id renumbered
    to the new row numbers, and the added vectors put in the live lists (no training, no
    reassignment of the 100k vectors already there)."""
    index = load_faiss(path)
    if len(removed):
        index.remove_ids(faiss.IDSelectorArray(np.ascontiguousarray(removed, dtype=np.int64)))
    renumber = np.cumsum(keep) - 1
    ivf = faiss.extract_index_ivf(index)
    lists = ivf.invlists
    for number in range(ivf.nlist):
        size = lists.list_size(number)
        if size:  # the list's ids, in place (ArrayInvertedLists: plain arrays)
            ids = faiss.rev_swig_ptr(lists.get_ids(number), size)
            ids[:] = renumber[ids]
    kept = int(keep.sum())
    index.add_with_ids(added, np.arange(kept, kept + len(added), dtype=np.int64))
    return index


def _text_index(
    base: Path, manifest: dict[str, Any], keep: np.ndarray, appended: pa.Table
) -> TextIndex:
    """The live BM25 postings less the removed rows, plus the appended rows' postings, every
    idf recomputed (lengths normalised by the live version's mean length)."""
    old = TextIndex.load(base / "bm25", len(keep))
    average = float(manifest.get("bm25_avg_length") or 1.0)
    # The appended rows' postings, on the same vocabulary (new terms go at its end).
    columns = appended.select(["search_text", "event_time", "kind"])
    documents = bm25_documents(pl.from_arrow(columns))
    terms = tokenize_corpus(documents)
    vocab = dict(old.vocab)
    mapping = np.asarray([vocab.setdefault(term, len(vocab)) for term in terms.vocab], np.int64)
    by_doc = sp.csr_matrix(
        (
            np.ones(len(terms.doc_ids), dtype=np.float32),
            (np.asarray(terms.doc_ids, np.int64), mapping[np.asarray(terms.term_ids, np.int64)]),
        ),
        shape=(appended.num_rows, len(vocab)),
    )
    by_doc.sum_duplicates()
    new_docs = np.repeat(np.arange(appended.num_rows, dtype=np.int64), np.diff(by_doc.indptr))
    new_terms = by_doc.indices.astype(np.int64)
    tf = by_doc.data
    length = np.asarray(by_doc.sum(axis=1)).ravel().astype(np.float32)
    norm = np.float32(K1 * (1.0 - B)) + np.float32(K1 * B / max(average, 1e-9)) * length[new_docs]
    return merged_postings(
        old, keep, vocab, (new_terms, new_docs, tf, norm), appended.num_rows, average
    )


def merged_postings(
    old: TextIndex,
    keep: np.ndarray,
    vocab: dict[str, int],
    new: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    added_rows: int,
    average: float,
) -> TextIndex:
    """`old`'s postings of the rows `keep` keeps (renumbered in order), every weight's idf
    made anew, and the `new` postings (term, document, tf, length norm: one entry each),
    documents numbered after the kept rows. `vocab` is `old`'s with the new terms at its end.

    Without a pass of fancy indexing and sorting over every posting (1M rows: ~90M postings,
    12.7 s): a term's kept postings stay in order (the renumbering keeps it) and its new ones,
    on documents after them all, follow them; the old runs are copied between the terms
    that gain postings. The result is the term → documents matrix a rebuild of the same
    postings would give, bit for bit (`tests/index/test_incremental.py`).
    """
    new_terms, new_docs, tf, norm = new
    old_df = np.diff(old.indptr)
    if keep.all():
        kept_docs, kept_weights, kept_per_term = old.docs, old.weights, old_df
    else:
        kept_entry = keep[old.docs]
        # Kept postings before each one (int32 while they fit: 90M postings, 0.36 GB less).
        counter = np.int32 if len(kept_entry) < np.iinfo(np.int32).max else np.int64
        before = np.zeros(len(kept_entry) + 1, dtype=counter)
        np.cumsum(kept_entry, dtype=counter, out=before[1:])
        kept_per_term = before[old.indptr[1:]] - before[old.indptr[:-1]]
        renumber = (np.cumsum(keep) - 1).astype(np.int32)
        kept_docs = renumber[old.docs[kept_entry]]
        kept_weights = old.weights[kept_entry]
    kept = int(keep.sum())
    size = kept + added_rows
    # A (term, document) pair is one posting: a term's df is its number of postings.
    df = np.bincount(new_terms, minlength=len(vocab))
    df[: len(kept_per_term)] += kept_per_term
    idf = np.log1p((size - df + 0.5) / (df + 0.5)).astype(np.float32)
    old_idf = np.log1p((len(keep) - old_df + 0.5) / (old_df + 0.5)).astype(np.float32)
    kept_weights = kept_weights * np.repeat(idf[: len(old_df)] / old_idf, kept_per_term)
    order = np.lexsort((new_docs, new_terms))  # by term, then document
    new_terms, new_docs = new_terms[order], new_docs[order].astype(np.int32) + np.int32(kept)
    tf, norm = tf[order], norm[order]
    new_weights = (idf[new_terms] * tf / (tf + norm)).astype(np.float32)

    kept_indptr = np.zeros(len(kept_per_term) + 1, dtype=np.int64)
    np.cumsum(kept_per_term, out=kept_indptr[1:])
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    docs = np.empty(int(indptr[-1]), dtype=np.int32)
    weights = np.empty(int(indptr[-1]), dtype=np.float32)
    terms, starts = np.unique(new_terms, return_index=True)
    copied = written = 0  # kept postings copied, postings written
    ends = np.append(starts[1:], len(new_terms))[: len(starts)]
    for term, start, end in zip(terms, starts, ends, strict=True):
        # The kept postings up to the end of this term's list, then its new ones.
        until = int(kept_indptr[min(int(term) + 1, len(kept_indptr) - 1)])
        docs[written : written + until - copied] = kept_docs[copied:until]
        weights[written : written + until - copied] = kept_weights[copied:until]
        written, copied = written + until - copied, until
        docs[written : written + end - start] = new_docs[start:end]
        weights[written : written + end - start] = new_weights[start:end]
        written += end - start
    docs[written:] = kept_docs[copied:]
    weights[written:] = kept_weights[copied:]
    return TextIndex(vocab, indptr, docs, weights, size, average)
