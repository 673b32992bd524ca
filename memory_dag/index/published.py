"""The published search index: one immutable folder per build, swapped in atomically.

    data/index/
      CURRENT                  name of the live version folder (replaced with os.replace)
      v20261122T040501-3f2a/
        manifest.json          model, dimensions, row count, index type, fingerprint
        vectors.faiss          FAISS index; FAISS id = row number
        vectors.npy            the same vectors in row order (scoped exact search, MMR)
        bm25/                  BM25 weights, term → rows (see text_index.py)
        rows.parquet           row number → chunk id, path, lines, ids, snippet
        row_hashes.parquet     row number → content hash (what the next build compares with)
        memories.parquet       the catalog: every derived memory (any state) with its scope
                               columns, for lookups without the DuckDB file (`catalog`)

A build writes a hidden temporary folder, renames it into place, then swaps CURRENT. A
reader therefore always sees a whole version: the last good one if a build crashed.

The manifest's `journal_seq` is the last live write (`memories/journal.py`) the store had folded
when the rows were read: the delta segment (`delta.py`) adds what was written after it.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memory_dag.collection import collection_paused
from memory_dag.index.faiss_import import faiss
from memory_dag.index.search_text import bm25_documents
from memory_dag.index.text_index import TOKENIZE_BATCH, TextIndex
from memory_dag.index.vector_index import (
    build_faiss_from_file,
    index_type_for,
    load_faiss,
    save_faiss,
)
from memory_dag.paths import resolved

FORMAT_VERSION = 3  # bump when the folder layout or row columns change
KEEP_VERSIONS = 2  # the live one and its predecessor (a reader may still be loading it)

ROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("kind", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("start_line", pa.int32()),
        ("end_line", pa.int32()),
        ("text", pa.string()),
        ("search_text", pa.string()),
        ("speaker", pa.string()),
        ("turn_ids", pa.list_(pa.string())),
        ("conversation_id", pa.string()),
        ("session_id", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("role", pa.string()),
        ("category", pa.string()),
        ("user_id", pa.string()),
        ("agent_id", pa.string()),
        ("importance", pa.int32()),
        ("pinned", pa.bool_()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)

#: Kinds of rows that are pieces of workspace files (the rest are derived memories).
CHUNK_KINDS = frozenset({"note", "entry", "transcript"})

#: (id, content hash) of every row, in row order (`incremental.py` compares with it).
HASHES_FILE = "row_hashes.parquet"

#: The catalog of derived memories published with each version (`memories` columns).
CATALOG_FILE = "memories.parquet"
CATALOG_COLUMNS = (
    "id", "kind", "content", "state", "conversation_id", "session_id", "user_id", "agent_id",
    "source_role", "speaker", "category", "importance", "pinned", "event_time", "created_at",
    "valid_until", "purge_at", "confidence", "decay_rate", "source_ids", "tags", "attributes",
    "replaced_by", "supersedes",
)  # fmt: skip

#: Text columns that searches can filter on by equality, kept as integer codes in memory.
CODED_COLUMNS = (
    "kind",
    "source",
    "path",
    "conversation_id",
    "session_id",
    "speaker",
    "role",
    "category",
    "user_id",
    "agent_id",
)


class IndexNotBuiltError(FileNotFoundError):
    """No index has been published yet in this folder."""


@dataclass
class PublishedIndex:
    """A loaded, read-only index version; everything search needs, in memory or mapped
    (`load_index`)."""

    folder: Path
    manifest: dict[str, Any]
    faiss_index: faiss.Index
    vectors: np.ndarray
    text: TextIndex
    #: row columns by name: `rows[column][row]` (`ColumnLists` when loaded from a folder).
    rows: Mapping[str, list[Any]]
    rows_by_conversation: dict[str | None, np.ndarray] = field(default_factory=dict)
    rows_by_session: dict[str | None, np.ndarray] = field(default_factory=dict)
    #: Row number of the previous / next chunk of the same file (-1 at either end).
    prev_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    next_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Small integer per file path (sessions are files) and per lower-cased speaker (-1: none).
    path_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    speaker_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    speakers: list[str] = field(default_factory=list)
    #: column → (integer code per row, value → code), for the filterable text columns.
    codes: dict[str, tuple[np.ndarray, dict[Any, int]]] = field(default_factory=dict)
    importance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pinned: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    updated_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    #: The catalog (`memories.parquet`), loaded on first use by `catalog()`.
    _catalog: Catalog | None = field(default=None, repr=False)
    _rows_by_id: dict[str, int] | None = field(default=None, repr=False)
    #: The transcript turn ids indexed from each file path, as the delta overlay asked for
    #: them (`delta._IndexedTurns`): kept with the version, for every overlay built over it.
    turns_by_path: dict[str, set[str]] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return int(self.manifest["count"])

    @property
    def journal_seq(self) -> int:
        """The last live write this version holds (0: none, or built before there were any)."""
        return int(self.manifest.get("journal_seq") or 0)

    def row_of(self, row_id: str) -> int | None:
        """The row number of an id (a chunk or a derived memory), or None."""
        if self._rows_by_id is None:
            self._rows_by_id = {value: row for row, value in enumerate(self.rows["id"])}
        return self._rows_by_id.get(row_id)

    def catalog(self) -> Catalog:
        """The store's derived memories as of this version (empty when it has none)."""
        if self._catalog is None:
            path = self.folder / CATALOG_FILE
            table = pq.read_table(path) if path.exists() else None
            self._catalog = Catalog(table)
        return self._catalog


class Catalog:
    """Derived memories (facts, summaries, ...) of one index version, in any state, by id:
    what a live write needs to know about a memory without opening the DuckDB file."""

    def __init__(self, table: pa.Table | None) -> None:
        self.table = table
        ids = table.column("id").to_pylist() if table is not None else []
        self._position = {memory_id: i for i, memory_id in enumerate(ids)}
        self._rows: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self._position)

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """The memory's row (the `memories` columns of `CATALOG_COLUMNS`), or None."""
        position = self._position.get(memory_id)
        if position is None or self.table is None:
            return None
        return self.table.slice(position, 1).to_pylist()[0]

    def rows(self) -> list[dict[str, Any]]:
        """Every row (read once per version)."""
        if self._rows is None:
            self._rows = self.table.to_pylist() if self.table is not None else []
        return self._rows


def empty_index(folder: Path, *, provider: str, model: str, dims: int) -> PublishedIndex:
    """An index of no rows (before the first build): live writes are searched on top of it."""
    manifest = {
        "format": FORMAT_VERSION,
        "version": "",
        "provider": provider,
        "model": model,
        "dims": dims,
        "count": 0,
        "store_users": 0,
        "journal_seq": 0,
    }
    rows = {name: [] for name in ROW_SCHEMA.names}
    return PublishedIndex(
        folder=folder,
        manifest=manifest,
        faiss_index=faiss.IndexFlatIP(max(dims, 1)),
        vectors=np.zeros((0, dims), dtype=np.float32),
        text=TextIndex({}, np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0), 0, 1.0),
        rows=rows,
        codes={column: (np.zeros(0, np.int64), {}) for column in CODED_COLUMNS},
        speakers=[],
    )


def publish_index(
    index_dir: Path,
    rows: pa.Table,
    vectors: np.ndarray,
    *,
    provider: str,
    model: str,
    fingerprint: str,
    store_users: int | None = None,
    catalog: pa.Table | None = None,
    journal_seq: int = 0,
    hashes: pa.Array | pa.ChunkedArray | None = None,
) -> dict[str, Any]:
    """Build FAISS + BM25 for `rows`/`vectors`, write a new version, make it current.

    `store_users` (how many users the store names) goes into the manifest for the scope check;
    `catalog` (the store's derived memories, `CATALOG_COLUMNS`) is written beside the rows;
    `journal_seq` is the last live write folded into the store these rows were read from;
    `hashes` (each row's content hash) lets the next build add to this version
    (`incremental.py`) instead of rebuilding it.
    """
    if rows.num_rows != len(vectors):
        raise ValueError(f"{rows.num_rows} rows but {len(vectors)} vectors")
    if hashes is not None:
        rows = rows.append_column("hash", hashes)
    staged = stage_rows(index_dir, rows.to_reader(), hashes=hashes is not None)
    try:
        stage_vectors(staged, vectors)
    except BaseException:
        discard_staged(staged)
        raise
    return publish_staged(
        index_dir,
        staged,
        provider=provider,
        model=model,
        fingerprint=fingerprint,
        store_users=store_users,
        catalog=catalog,
        journal_seq=journal_seq,
    )


@dataclass
class StagedRows:
    """The rows of the next version, written to its staging folder (`rows.parquet`)."""

    staging: Path
    name: str
    count: int
    #: Each row's content hash, in row order (None when the rows came without).
    hashes: pa.Array | None
    #: Dimensions of the vectors written by `stage_vectors` (0: none).
    dims: int = 0
    #: The BM25 index of the rows (`bm25/`), built by a thread from `rows.parquet` as soon as
    #: it is written, beside the vectors' fetch and FAISS; done: its mean document length.
    #: None: `publish_staged` builds it (above `BM25_BESIDE_FETCH_MAX_ROWS` rows).
    bm25: Future[float | None] | None = None


#: Rows written to `rows.parquet` at a time (a Parquet row group each).
ROW_BATCH = 65_536


def stage_rows(index_dir: Path, rows: Iterable[pa.RecordBatch], *, hashes: bool) -> StagedRows:
    """Write rows (ROW_SCHEMA columns, missing ones null, plus `hash` when `hashes`) batch by
    batch into a new staging folder, so that a rebuild never holds every row's text at once;
    the (id, hash) pairs go to `row_hashes.parquet`. The rows' BM25 build starts at once, in a
    thread (`StagedRows.bm25`), unless there are more than `BM25_BESIDE_FETCH_MAX_ROWS`."""
    staging, name = new_staging(index_dir)
    try:
        ids: list[pa.Array] = []
        row_hashes: list[pa.Array] = []
        with pq.ParquetWriter(staging / "rows.parquet", ROW_SCHEMA) as writer:
            for batch in rows:
                table = pa.Table.from_batches([batch])
                if hashes:
                    row_hashes.append(table.column("hash").combine_chunks().cast(pa.string()))
                writer.write_table(_row_table(table), row_group_size=ROW_BATCH)
                ids.append(table.column("id").combine_chunks().cast(pa.string()))
        all_ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
        all_hashes = None
        if hashes:
            all_hashes = pa.concat_arrays(row_hashes) if row_hashes else pa.array([], pa.string())
            pq.write_table(pa.table({"id": all_ids, "hash": all_hashes}), staging / HASHES_FILE)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staged = StagedRows(staging, name, len(all_ids), all_hashes)
    if staged.count <= BM25_BESIDE_FETCH_MAX_ROWS:
        # Its own thread, gone when the build is: it starts now, while the caller fetches the
        # vectors (DuckDB works outside the GIL), instead of after them (at 100k rows the BM25
        # build was the index step's last 1.6 s, on one core).
        builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bm25-build")
        staged.bm25 = builder.submit(_build_bm25, staging, staged.count)
        builder.shutdown(wait=False)
    return staged


#: Up to this many rows the BM25 build starts as soon as the rows are staged; above, it waits
#: for the vectors (`publish_staged` builds it beside FAISS), for memory: at 1M rows, beside the
#: vectors' fetch, it raised the search index's peak RSS from 3.6 to 4.3 GB (and took 6 s off
#: its 73), which would have put the whole graph's peak over 6 GB.
BM25_BESIDE_FETCH_MAX_ROWS = 250_000


def _build_bm25(staging: Path, count: int) -> float | None:
    """The BM25 index of the staged rows, saved as `bm25/`; returns its mean document length."""
    text_index = TextIndex.from_batches(_bm25_document_batches(staging / "rows.parquet"), count)
    text_index.save(staging / "bm25")
    return text_index.avg_length


def _row_table(table: pa.Table) -> pa.Table:
    """`table` as ROW_SCHEMA: optional columns null, others dropped, types cast."""
    for name in ROW_SCHEMA.names:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, ROW_SCHEMA.field(name).type))
    return table.select(ROW_SCHEMA.names).cast(ROW_SCHEMA)


def stage_vectors(staged: StagedRows, vectors: np.ndarray) -> None:
    """Write the rows' vectors, in row order, as the staging folder's `vectors.npy`: the FAISS
    build reads them back from it (`build_faiss_from_file`), so the caller may let go of
    them before the build."""
    if staged.count != len(vectors):
        raise ValueError(f"{staged.count} rows but {len(vectors)} vectors")
    np.save(staged.staging / "vectors.npy", np.ascontiguousarray(vectors, dtype=np.float32))
    staged.dims = int(vectors.shape[1]) if vectors.ndim == 2 and vectors.shape[1] else 0


def discard_staged(staged: StagedRows) -> None:
    """Remove a staging folder whose version will not be published (once its BM25 build, which
    writes there, has stopped)."""
    if staged.bm25 is not None and not staged.bm25.cancel():
        wait([staged.bm25])
    shutil.rmtree(staged.staging, ignore_errors=True)


def publish_staged(
    index_dir: Path,
    staged: StagedRows,
    *,
    provider: str,
    model: str,
    fingerprint: str,
    store_users: int | None = None,
    catalog: pa.Table | None = None,
    journal_seq: int = 0,
) -> dict[str, Any]:
    """Build FAISS + BM25 for staged rows and vectors (`stage_rows`, `stage_vectors`), and
    make the version current.

    Both read their input back from the staging folder, a batch at a time: BM25 in the thread
    `stage_rows` started, FAISS in another."""
    staging, name, count, dims = staged.staging, staged.name, staged.count, staged.dims
    try:
        if not (staging / "vectors.npy").exists():
            raise ValueError(f"{staging}: no vectors staged (stage_vectors)")
        # FAISS trains and adds outside the GIL: it runs beside the BM25 build (which is
        # mostly Python and Polars), ~2 s at 100k rows that would otherwise come on top.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="faiss-build") as background:
            vector_files = background.submit(_write_vector_index, dims, staging)
            if catalog is not None:
                pq.write_table(catalog, staging / CATALOG_FILE)
            bm25 = staged.bm25
            bm25_avg_length = bm25.result() if bm25 is not None else _build_bm25(staging, count)
            vector_files.result()
        manifest = {
            "format": FORMAT_VERSION,
            "version": name,
            "built_at": datetime.now(UTC).isoformat(),
            "provider": provider,
            "model": model,
            "dims": dims,
            "count": count,
            "faiss_type": index_type_for(count) if dims else "none",
            "fingerprint": fingerprint,
            "store_users": store_users,
            "journal_seq": int(journal_seq),
            "bm25_avg_length": bm25_avg_length,
        }
        install_version(index_dir, staging, name, manifest)
    except BaseException:
        discard_staged(staged)
        raise
    return manifest


def _bm25_document_batches(path: Path) -> Iterator[pl.Series]:
    """The BM25 documents of the rows in `path`, `TOKENIZE_BATCH` at a time: a Polars copy of
    every search text at once would be ~1 GB at 1M rows."""
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(
        batch_size=TOKENIZE_BATCH, columns=["search_text", "event_time", "kind"]
    ):
        frame = pl.from_arrow(batch)
        assert isinstance(frame, pl.DataFrame)
        yield bm25_documents(frame)


def new_staging(index_dir: Path) -> tuple[Path, str]:
    """A hidden folder to write the next version into, and the version's name."""
    index_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    name = f"v{stamp}-{uuid.uuid4().hex[:6]}"
    staging = index_dir / f".tmp-{name}"
    staging.mkdir()
    return staging, name


def install_version(index_dir: Path, staging: Path, name: str, manifest: dict[str, Any]) -> None:
    """Write the manifest, move the folder into place, then swap CURRENT (readers see a whole
    version, the last good one if this crashes)."""
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
    staging.rename(index_dir / name)
    pointer = index_dir / f".CURRENT-{uuid.uuid4().hex[:6]}"
    pointer.write_text(name)
    os.replace(pointer, index_dir / "CURRENT")
    _remove_old_versions(index_dir, keep=name)


def _write_vector_index(dims: int, folder: Path) -> None:
    if dims:
        save_faiss(build_faiss_from_file(folder / "vectors.npy"), folder / "vectors.faiss")


def _remove_old_versions(index_dir: Path, keep: str) -> None:
    versions = sorted(p for p in index_dir.iterdir() if p.is_dir() and p.name.startswith("v"))
    stale = [p for p in versions if p.name != keep][: max(0, len(versions) - KEEP_VERSIONS)]
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    for leftover in index_dir.glob(".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def current_version(index_dir: Path) -> str | None:
    try:
        return (index_dir / "CURRENT").read_text().strip() or None
    except FileNotFoundError:
        return None


def read_manifest(index_dir: Path) -> dict[str, Any] | None:
    name = current_version(index_dir)
    if name is None:
        return None
    return json.loads((index_dir / name / "manifest.json").read_text())


def load_index(index_dir: Path) -> PublishedIndex:
    """Load the current version: the FAISS index in memory, the vectors and BM25 postings
    memory-mapped read-only, the rows as Arrow columns that become Python values when
    first read (`ColumnLists`)."""
    name = current_version(index_dir)
    if name is None:
        raise IndexNotBuiltError(f"no search index in {index_dir}: run `memory-dag ingest` first")
    folder = index_dir / name
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("format") != FORMAT_VERSION:
        raise IndexNotBuiltError(
            f"the index in {index_dir} was built by another memory-dag version "
            f"(format {manifest.get('format')}, need {FORMAT_VERSION}): run `memory-dag ingest`"
        )
    # The search texts (the largest column) are what the BM25 and vectors were made from;
    # no reader needs them, so they are read only if one asks (`ColumnLists`).
    rows_file = folder / "rows.parquet"
    names = [n for n in pq.read_schema(rows_file).names if n not in _READ_ON_DEMAND]
    table = pq.read_table(rows_file, columns=names)
    faiss_path = folder / "vectors.faiss"
    faiss_index = load_faiss(faiss_path) if faiss_path.exists() else faiss.IndexFlatIP(1)
    encoded = {column: _dictionary_encoded(table.column(column)) for column in CODED_COLUMNS}
    codes = {column: _codes_and_lookup(*encoded[column]) for column in CODED_COLUMNS}
    # Neighbours and sessions are runs of chunks of one file; a derived memory (a fact, a
    # summary) stands alone even when it records the file it came from.
    kind, path, row_id = (table.column(c).combine_chunks() for c in ("kind", "path", "id"))
    file_or_memory = pc.if_else(
        pc.is_in(kind, value_set=pa.array(sorted(CHUNK_KINDS), pa.string())),
        path,
        pc.binary_join_element_wise(kind, row_id, ":"),
    )
    path_code = _dictionary_encoded(file_or_memory)[0]
    same_as_previous = np.zeros(len(path_code), dtype=bool)
    same_as_previous[1:] = path_code[1:] == path_code[:-1]
    positions = np.arange(len(path_code))
    prev_row = np.where(same_as_previous, positions - 1, -1)
    next_row = np.full(len(path_code), -1)
    next_row[:-1] = np.where(same_as_previous[1:], positions[1:], -1)
    speakers, speaker_code = _speaker_codes(*encoded["speaker"])
    return PublishedIndex(
        folder=folder,
        manifest=manifest,
        faiss_index=faiss_index,
        # Memory-mapped, read only: a command touches the pages of its few rows, where
        # reading the whole matrix took 1.7 s and 1.2 GB at 1M rows; a service's pages stay
        # in the page cache (a conversation's rows are a slice). A plain array over the
        # mapping: `np.memmap`'s indexing costs ~5 µs a call more.
        vectors=np.asarray(np.load(folder / "vectors.npy", mmap_mode="r")),
        text=_text_index(folder, table.num_rows, manifest),
        rows=ColumnLists(table, rows_file, encoded),
        rows_by_conversation=_group_rows(*encoded["conversation_id"]),
        rows_by_session=_group_rows(*encoded["session_id"]),
        prev_row=prev_row,
        next_row=next_row,
        path_code=path_code,
        speaker_code=speaker_code,
        speakers=speakers,
        codes=codes,
        importance=_int_column(table, "importance"),
        pinned=np.asarray(table.column("pinned").fill_null(False).to_numpy(zero_copy_only=False)),
        updated_us=_int_column(table, "updated_at"),
    )


#: Row columns `load_index` leaves in the file until a reader asks for them.
_READ_ON_DEMAND = frozenset({"search_text"})
#: Rows a process reads one by one (`ColumnLists.take`) before its columns are made lists.
LISTS_AFTER_ROWS = 500


class ColumnLists(Mapping[str, list[Any]]):
    """A version's rows as Arrow columns: `rows[column]` makes a column a list of Python
    values the first time it is asked for, and keeps it; `take` reads a few rows' values.

    A search reads a few values of a few columns (its hits'). Making every column Python
    values as the version loaded was most of the load: 100k rows, 2.75 of 3.6 s, two thirds
    of it the two time columns (Arrow builds each time with a time zone lookup; here they are
    the epoch plus their microseconds). A column left in the file (`_READ_ON_DEMAND`) is read
    when first asked for.
    """

    def __init__(
        self,
        table: pa.Table,
        path: Path | None = None,
        encoded: Mapping[str, tuple[np.ndarray, list[Any]]] | None = None,
    ) -> None:
        self._table = table
        self._path = path
        #: Columns already dictionary-encoded (`load_index`'s codes): their lists come from
        #: the codes, ~5x faster than from Arrow.
        self._encoded = dict(encoded or {})
        self._names = list(ROW_SCHEMA.names) if path is not None else list(table.column_names)
        for name in table.column_names:
            if name not in self._names:
                self._names.append(name)
        self._lists: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self._rows_taken = 0

    def __getitem__(self, name: str) -> list[Any]:
        values = self._lists.get(name)
        if values is not None:
            return values
        if name not in self._names:
            raise KeyError(name)
        with self._lock, collection_paused():
            if name not in self._lists:
                if name in self._encoded:
                    codes, distinct_values = self._encoded[name]
                    distinct = np.empty(len(distinct_values), dtype=object)
                    distinct[:] = distinct_values
                    self._lists[name] = distinct[codes].tolist()
                elif name in self._table.column_names:
                    self._lists[name] = python_values(self._table.column(name))
                else:  # left in the file
                    assert self._path is not None
                    column = pq.read_table(self._path, columns=[name]).column(name)
                    self._lists[name] = python_values(column)
            return self._lists[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def take(self, positions: Sequence[int], names: Sequence[str]) -> list[dict[str, Any]]:
        """The values of columns `names` at rows `positions`, a dict a row.

        From the columns' lists when they exist. Before that from Arrow, the rows of each
        row group in one read (Arrow's take of a whole column joins its chunks first, ~0.1 s
        a call at 100k rows): a command searches a few times and reads ~100 rows (~1 ms a
        search more than from lists), where making the lists of a hit's columns costs
        ~0.25 s at 100k rows. A process that reads more (a service, an agent's loop) has the
        lists of the columns it reads made, once, when it has read `LISTS_AFTER_ROWS` rows
        this way (after a few searches), and reads them from then on.
        """
        self._rows_taken += len(positions)
        if self._rows_taken > LISTS_AFTER_ROWS:
            for name in names:
                self[name]
        if all(name in self._lists for name in names):
            lists = [self._lists[name] for name in names]
            return [
                {name: values[p] for name, values in zip(names, lists, strict=True)}
                for p in positions
            ]
        in_table = [name for name in names if name in self._table.column_names]
        batches = self._table.select(in_table).to_batches()
        ends = np.cumsum([batch.num_rows for batch in batches], dtype=np.int64)
        at = np.asarray(positions, dtype=np.int64)
        which = np.searchsorted(ends, at, side="right")
        taken: list[dict[str, Any]] = [{} for _ in positions]
        for number in np.unique(which).tolist():
            chosen = np.flatnonzero(which == number)
            start = int(ends[number]) - batches[number].num_rows
            rows = batches[number].take(pa.array(at[chosen] - start)).to_pylist()
            for place, row in zip(chosen.tolist(), rows, strict=True):
                taken[place] = row
        for name in names:
            if name not in in_table:  # a column left in the file: read whole
                values = self[name]
                for place, p in enumerate(positions):
                    taken[place][name] = values[p]
        return taken


def python_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """`column.to_pylist()`, with UTC times made as the epoch plus their microseconds (the
    same datetimes, time zone included, ~7x faster than Arrow's conversion)."""
    kind = column.type
    if not (pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz == "UTC"):
        return column.to_pylist()
    micros = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).tolist()
    missing = column.is_null().to_numpy(zero_copy_only=False).tolist()
    return [
        None if null else _UTC_EPOCH + timedelta(microseconds=value)
        for value, null in zip(micros, missing, strict=True)
    ]


_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))  # the tzinfo Arrow gives "UTC"


def _dictionary_encoded(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """(each row's code, the distinct values in order of first appearance); a null is a value
    like any other."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    encoded = pc.dictionary_encode(array, null_encoding="encode")
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes, encoded.dictionary.to_pylist()


def _codes_and_lookup(codes: np.ndarray, values: list[Any]) -> tuple[np.ndarray, dict[Any, int]]:
    return codes, {value: code for code, value in enumerate(values)}


def _group_rows(codes: np.ndarray, values: list[Any]) -> dict[Any, np.ndarray]:
    """Each value's rows, ascending, in order of the values' first appearance."""
    order = np.argsort(codes, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=len(values)))
    starts = ends - np.bincount(codes, minlength=len(values))
    return {
        value: order[start:end]
        for value, start, end in zip(values, starts.tolist(), ends.tolist(), strict=True)
        if end > start
    }


def _speaker_codes(codes: np.ndarray, values: list[Any]) -> tuple[list[str], np.ndarray]:
    """The lower-cased speakers, sorted, and each row's place among them (-1: no speaker).
    Each distinct speaker is lower-cased once, in Python (as a query's speaker is)."""
    speakers = sorted({value.lower() for value in values if value})
    place = {name: i for i, name in enumerate(speakers)}
    of_value = np.asarray([place[value.lower()] if value else -1 for value in values], np.int64)
    return speakers, of_value[codes] if len(values) else np.zeros(0, np.int64)


def _text_index(folder: Path, size: int, manifest: dict[str, Any]) -> TextIndex:
    text = TextIndex.load(folder / "bm25", size, mapped=True)
    text.avg_length = manifest.get("bm25_avg_length")
    return text


def _int_column(table: pa.Table, name: str) -> np.ndarray:
    """An integer view of a column (timestamps as epoch microseconds); null → -1."""
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return np.asarray(column.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


_cache: dict[Path, PublishedIndex] = {}
_cache_lock = threading.Lock()


def cached_index(index_dir: Path) -> PublishedIndex:
    """The current version, loaded once per process and reloaded when CURRENT changes."""
    key = resolved(index_dir)
    name = current_version(key)
    with _cache_lock:
        loaded = _cache.get(key)
        if loaded is None or loaded.folder.name != name:
            loaded = load_index(key)
            _cache[key] = loaded
        return loaded


def row_values(
    rows: Mapping[str, list[Any]], positions: Sequence[int], names: Sequence[str]
) -> list[dict[str, Any]]:
    """`ColumnLists.take` for any row columns (an empty index's are plain lists)."""
    if isinstance(rows, ColumnLists):
        return rows.take(positions, names)
    return [{name: rows[name][p] for name in names} for p in positions]
