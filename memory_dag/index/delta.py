"""The delta segment: what live writes changed since the published index version.

A live write (`memories/live_writer.py`) appends to the journal (the source of truth) and then,
under the same lock, to this small file beside the published index:

    <index_dir>/delta.jsonl    one record per change, fsynced, in journal order

    {"seq": 7, "at": "...", "op": "put",  "event": "created", "memory": {...}, "search": {...},
     "vector": "<base64 float32>", "model": "wordllama/l2_supercat_256"}
    {"seq": 8, "at": "...", "op": "drop", "event": "deleted", "memory": {...}, "by": "fact_..."}
    {"seq": 9, "at": "...", "op": "note", "event": "confirmed", "memory": {...}}

`put` makes a row searchable (a new fact, a restored one, a transcript turn: `search` is its
published-index row, embedded at write time), `drop` makes a memory disappear (forgotten,
replaced, contradicted), `note` is a change the delta header shows and search does not.

Every reader (`Searcher`, in any process) lays the records over the version it loaded
(`Overlay`): the records the version already holds are skipped (a memory change whose `seq` is
at most the manifest's `journal_seq`; a transcript turn the version indexes), and for the rest
the latest record of each memory wins: its published row is hidden, a `put` is searched beside
the published rows. Readers notice a new record by the file's size (one `stat` per search),
read only the new lines and lay only them over a copy of the overlay they hold
(`extend_overlay`); a rewritten file, a new version, or a record that changes a memory already
laid makes them build it from scratch. Writers rewrite the file without what the published
version holds (`compact`) when it grows, so it stays small.

(About 600 lines on purpose: the record format, the incremental reader and the overlay and its
extension are one concept and change together.)
"""

from __future__ import annotations

import base64
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from memory_dag.index.overlay_columns import Postings, RowColumns
from memory_dag.index.published import PublishedIndex, row_values
from memory_dag.index.search_text import bm25_documents
from memory_dag.index.text_index import K1, B, tokenize
from memory_dag.memories.journal import write_durably
from memory_dag.paths import resolved

DELTA_FILE = "delta.jsonl"
#: A writer compacts the delta once it holds this many records the published version has.
COMPACT_AFTER = 512
#: Kinds of memories that are shared transcript turns (a `put` of one is a transcript row).
TURN_KIND = "episode"
#: The event of a turn the chunks stage laid from a workspace file (`early_turns.py`): when the
#: files stage deletes or re-reads that file, the record goes (`drop_laid_turns`).
EARLY_TURN_EVENT = "laid_from_file"


def delta_path(index_dir: Path) -> Path:
    return Path(index_dir) / DELTA_FILE


# --------------------------------------------------------------------------- records


def encode_vector(vector: np.ndarray | None) -> str | None:
    if vector is None:
        return None
    return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode("ascii")


def decode_vector(text: str | None) -> np.ndarray | None:
    if not text:
        return None
    return np.frombuffer(base64.b64decode(text), dtype=np.float32)


def record(
    seq: int,
    at: datetime,
    op: str,
    event: str | None,
    memory: Mapping[str, Any],
    *,
    search: Mapping[str, Any] | None = None,
    vector: np.ndarray | None = None,
    model: str | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """One delta record (see the module doc)."""
    return {
        "seq": seq,
        "at": at.isoformat(),
        "op": op,
        "event": event,
        "memory": dict(memory),
        "search": dict(search) if search is not None else None,
        "vector": encode_vector(vector),
        "model": model,
        "by": by,
    }


def append_records(index_dir: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Append records (one fsynced write). Call under the journal's lock."""
    if not records:
        return
    Path(index_dir).mkdir(parents=True, exist_ok=True)
    data = "".join(_dumps(r) + "\n" for r in records).encode("utf-8")
    write_durably(delta_path(index_dir), data)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def last_seq(index_dir: Path) -> int:
    """The seq of the last record (0 when there is none)."""
    records = delta_file(index_dir).snapshot()[1]
    return int(records[-1]["seq"]) if records else 0


# --------------------------------------------------------------------------- reading


class DeltaFile:
    """The records of one delta file, read incrementally: a reader keeps its offset and reads
    only lines added since; a rewritten file (`compact`, a new inode) is read again whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: list[dict[str, Any]] = []
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        #: Changes whenever the records change (a new line, a rewrite).
        self.generation = 0
        #: Changes when the records are read again from the start (a rewrite, a lost file):
        #: within one epoch a later record list only adds records at its end.
        self.epoch = 0
        self._lock = threading.Lock()

    def snapshot(self) -> tuple[int, list[dict[str, Any]]]:
        """(generation, records) as the file stands now."""
        _, generation, records = self.read()
        return generation, records

    def read(self) -> tuple[int, int, list[dict[str, Any]]]:
        """(epoch, generation, records) as the file stands now."""
        import json

        with self._lock:
            try:
                info = os.stat(self.path)
            except FileNotFoundError:
                if self._records or self._identity is not None:
                    self._records, self._offset, self._identity = [], 0, None
                    self.generation += 1
                    self.epoch += 1
                return self.epoch, self.generation, self._records
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                self._records, self._offset, self._identity = [], 0, identity
                self.generation += 1
                self.epoch += 1
            if info.st_size > self._offset:
                with open(self.path, "rb") as handle:
                    handle.seek(self._offset)
                    data = handle.read(info.st_size - self._offset)
                end = data.rfind(b"\n") + 1  # a line still being written is read next time
                if end:
                    fresh = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
                    self._records = [*self._records, *fresh]
                    self._offset += end
                    self.generation += 1
            return self.epoch, self.generation, self._records


_files: dict[Path, DeltaFile] = {}
_files_lock = threading.Lock()


def delta_file(index_dir: Path) -> DeltaFile:
    """The process's reader of an index folder's delta file."""
    path = resolved(delta_path(index_dir))
    with _files_lock:
        reader = _files.get(path)
        if reader is None:
            reader = _files[path] = DeltaFile(path)
        return reader


# --------------------------------------------------------------------------- the overlay


@dataclass
class Change:
    """A memory change not yet in the store's change log (for the delta header)."""

    seq: int
    at: datetime
    event: str
    memory: dict[str, Any]
    by: str | None = None


@dataclass
class Overlay:
    """The delta records a published version does not hold yet, ready to search beside it."""

    #: Searchable rows (published-index row columns) and their vectors.
    rows: list[dict[str, Any]] = field(default_factory=list)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    #: memory id -> its row after the delta's last change to it (any state; turns too).
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Memory ids whose published rows are hidden (the delta has newer word on them).
    hidden: set[str] = field(default_factory=set)
    #: Memory ids the delta made inactive / active again.
    dead: set[str] = field(default_factory=set)
    alive: set[str] = field(default_factory=set)
    #: episode id -> the memory that superseded what it said (a drop of a fact drawn from it).
    superseded: dict[str, str | None] = field(default_factory=dict)
    #: Episodes of facts active again: no longer superseded by them.
    released: set[str] = field(default_factory=set)
    #: episode id -> active facts the delta drew from it.
    facts_of: dict[str, list[str]] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    #: The last record laid over the version (its seq), and the users and kinds the rows name.
    seq: int = 0
    users: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)
    hidden_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: The rows' filter columns and BM25 postings (`overlay_columns`), extended with them.
    _columns: RowColumns = field(default_factory=RowColumns)
    _postings: Postings = field(default_factory=Postings)
    _indexed_turns: _IndexedTurns | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def copy(self) -> Overlay:
        """A copy to extend: its containers are new, the rows and memories in them shared (an
        overlay is never changed once built, so readers in other threads may keep using it)."""
        return Overlay(
            rows=list(self.rows),
            vectors=self.vectors,
            memories=dict(self.memories),
            hidden=set(self.hidden),
            dead=set(self.dead),
            alive=set(self.alive),
            superseded=dict(self.superseded),
            released=set(self.released),
            facts_of=dict(self.facts_of),
            changes=list(self.changes),
            seq=self.seq,
            users=set(self.users),
            kinds=set(self.kinds),
            hidden_rows=self.hidden_rows,
            _columns=self._columns,
            _postings=self._postings,
            _indexed_turns=self._indexed_turns,
        )

    # ----------------------------------------------------------------- filtering

    def allowed(self, filters: Any) -> np.ndarray:
        """Positions of the rows that pass `SearchFilters` (as `search.allowed_rows` does)."""
        return self._columns.allowed(filters)

    def said_by(self, positions: np.ndarray, name: str) -> np.ndarray:
        """Mask over `positions`: rows whose lower-cased speaker is `name`."""
        return self._columns.said_by(positions, name)

    # ----------------------------------------------------------------- scoring

    def bm25(self, query: str, index: PublishedIndex) -> np.ndarray:
        """BM25 of every row for `query`, with the published version's term statistics (the
        delta's own rows counted in), so its scores compare with the version's. Only the rows
        holding a query term are touched (the others would add zero)."""
        scores = np.zeros(len(self.rows), dtype=np.float32)
        if not self.rows:
            return scores
        postings = self._postings
        total = index.text.size + len(self.rows)
        average = index.text.avg_length or float(postings.lengths.mean() or 1.0)
        norm = K1 * (1.0 - B) + K1 * B * postings.lengths / max(average, 1e-9)
        for term in tokenize(query):
            frequency = index.text.document_frequency(term) + postings.document_frequency(term)
            held = postings.by_term.get(term)
            if not frequency or held is None:
                continue
            idf = np.log1p((total - frequency + 0.5) / (frequency + 0.5))
            rows, tf = held
            scores[rows] += (idf * tf / (tf + norm[rows])).astype(np.float32)
        return scores


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


#: Drops that say a turn's statement no longer holds (as `lookups.superseded_turns` counts:
#: contradicted, replaced, forgotten), not decay or expiry.
SUPERSEDING_EVENTS = ("deleted", "soft_deleted", "replaced")
#: Events the change log records (the delta header); "replaced" is the old side of "updated".
CHANGE_EVENTS = ("created", "updated", "merged", "deleted", "soft_deleted", "restored", "confirmed")


def build_overlay(
    index: PublishedIndex,
    records: Iterable[Mapping[str, Any]],
    embed: Callable[[list[str]], np.ndarray] | None = None,
) -> Overlay:
    """The records `index` does not hold, laid over it (see the module doc).

    `embed` re-embeds rows whose stored vector came from another model than the version's.
    """
    overlay = extend_overlay(Overlay(), index, records, embed)
    assert overlay is not None  # an empty overlay has no memory a record could lay again
    return overlay


def extend_overlay(
    base: Overlay,
    index: PublishedIndex,
    records: Iterable[Mapping[str, Any]],
    embed: Callable[[list[str]], np.ndarray] | None = None,
) -> Overlay | None:
    """`base` (built over `index`) with `records`, the ones appended to the delta since, laid
    over it too: a new overlay that answers exactly as `build_overlay` over all the records
    would, at the cost of the new records only. None when a new record changes a memory `base`
    already laid (its row's place and the sets drawn from it would move): rebuild then."""
    overlay = base.copy()
    model = f"{index.manifest['provider']}/{index.manifest['model']}"
    latest: dict[str, Mapping[str, Any]] = {}
    if overlay._indexed_turns is None:
        overlay._indexed_turns = _IndexedTurns(index)
    for item in records:
        memory = item["memory"]
        overlay.seq = max(overlay.seq, int(item["seq"]))
        if _held(item, index, overlay._indexed_turns):
            continue
        if item["op"] in ("put", "drop", "note"):
            overlay.memories[memory["id"]] = dict(memory)  # the memory after the change
        if item["event"] in CHANGE_EVENTS:
            overlay.changes.append(
                Change(
                    int(item["seq"]),
                    datetime.fromisoformat(item["at"]),
                    item["event"],
                    dict(memory),
                    item.get("by"),
                )
            )
        if item["op"] in ("put", "drop"):
            if memory["id"] in base.hidden:
                return None
            latest[memory["id"]] = item
    start = len(overlay.rows)
    vectors: list[np.ndarray | None] = []
    stale: list[int] = []
    superseded: set[str] = set()
    released: set[str] = set()
    for memory_id, item in latest.items():
        memory = item["memory"]
        overlay.hidden.add(memory_id)
        if memory.get("user_id") is not None:
            overlay.users.add(memory["user_id"])
        sources = list(memory.get("source_ids") or [])
        if item["op"] == "drop":
            overlay.dead.add(memory_id)
            if memory.get("kind") == "fact" and item["event"] in SUPERSEDING_EVENTS:
                for episode in sources:
                    overlay.superseded[episode] = item.get("by")
                    superseded.add(episode)
            continue
        overlay.alive.add(memory_id)
        if memory.get("kind") == "fact":
            released.update(sources)
            for episode in sources:  # a new list: `base` keeps its own
                overlay.facts_of[episode] = [*overlay.facts_of.get(episode, []), memory_id]
        search = item.get("search")
        if search is None:
            continue
        overlay.rows.append(dict(search))
        overlay.kinds.add(search["kind"])
        vector = decode_vector(item.get("vector")) if item.get("model") == model else None
        if vector is None:
            stale.append(len(vectors))
        vectors.append(vector)
    # Episodes of active facts, less every superseded one (old and new alike).
    overlay.released = (overlay.released - superseded) | (released - overlay.superseded.keys())
    _vectors(overlay, start, vectors, stale, index, embed)
    _text_statistics(overlay, start)
    overlay._columns = overlay._columns.extended(overlay.rows[start:])
    fresh_rows = [row for row in (index.row_of(i) for i in latest) if row is not None]
    overlay.hidden_rows = np.sort(
        np.concatenate([overlay.hidden_rows, np.asarray(fresh_rows, dtype=np.int64)])
    )
    return overlay


def _vectors(
    overlay: Overlay,
    start: int,
    vectors: list[np.ndarray | None],
    stale: list[int],
    index: PublishedIndex,
    embed: Callable[[list[str]], np.ndarray] | None,
) -> None:
    """Append the vectors of the rows from `start` on (`vectors`, None where `stale`)."""
    dims = int(index.manifest["dims"])
    if stale:
        texts = [overlay.rows[start + i]["search_text"] for i in stale]
        fresh = embed(texts) if embed is not None and dims else np.zeros((len(texts), dims))
        for position, vector in zip(stale, fresh, strict=True):
            vectors[position] = vector
    added = (
        np.vstack([np.asarray(v, dtype=np.float32) for v in vectors])
        if vectors
        else np.zeros((0, dims), dtype=np.float32)
    )
    overlay.vectors = np.vstack([overlay.vectors, added]) if start else added


#: The BM25 terms of delta rows already seen (an overlay is rebuilt from scratch after a
#: compaction or a new version; a row's terms never change), keyed by what `bm25_documents`
#: reads. Cleared when it grows large.
_terms_seen: dict[tuple[str, Any, str], Counter[str]] = {}
_TERMS_SEEN_LIMIT = 200_000


def _text_statistics(overlay: Overlay, start: int) -> None:
    """Append the BM25 terms and lengths of the rows from `start` on to the postings."""
    rows = overlay.rows[start:]
    if not rows:
        return
    keys = [(r["search_text"], _time(r["event_time"]), r["kind"]) for r in rows]
    missing = list(dict.fromkeys(k for k in keys if k not in _terms_seen))
    if missing:
        frame = pl.DataFrame(
            {
                "search_text": [k[0] for k in missing],
                "event_time": [k[1] for k in missing],
                "kind": [k[2] for k in missing],
            },
            schema={
                "search_text": pl.String,
                "event_time": pl.Datetime("us", "UTC"),
                "kind": pl.String,
            },
        )
        if len(_terms_seen) + len(missing) > _TERMS_SEEN_LIMIT:
            _terms_seen.clear()
        for key, doc in zip(missing, bm25_documents(frame).to_list(), strict=True):
            _terms_seen[key] = Counter(tokenize(doc))
    overlay._postings = overlay._postings.extended([_terms_seen[k] for k in keys])


def _held(item: Mapping[str, Any], index: PublishedIndex, indexed_turns: _IndexedTurns) -> bool:
    """Whether `index` already holds what `item` says: a memory change up to its journal
    position, a transcript turn it indexes."""
    memory = item["memory"]
    if memory.get("kind") == TURN_KIND:
        return indexed_turns.holds(memory.get("path"), memory.get("turn_id"))
    return int(item["seq"]) <= index.journal_seq


class _IndexedTurns:
    """Which transcript turns (path, turn id) a published version indexes, per path on demand
    and remembered with the version (an overlay is built anew after many changes)."""

    def __init__(self, index: PublishedIndex) -> None:
        self.index = index
        self._by_path = index.turns_by_path

    def holds(self, path: str | None, turn_id: str | None) -> bool:
        if path is None or turn_id is None:
            return False
        turns = self._by_path.get(path)
        if turns is None:
            codes, lookup = self.index.codes["path"]
            code = lookup.get(path)
            rows = np.nonzero(codes == code)[0].tolist() if code is not None else []
            values = row_values(self.index.rows, rows, ("turn_ids",))
            turns = self._by_path[path] = {t for v in values for t in (v["turn_ids"] or [])}
        return turn_id in turns


@dataclass
class _Cached:
    """A process's latest overlay of one delta file: over which version, from which records."""

    version: str
    epoch: int
    generation: int
    count: int
    overlay: Overlay


_overlays: dict[str, _Cached] = {}
_overlays_lock = threading.Lock()


def current_overlay(
    index: PublishedIndex,
    index_dir: Path,
    embed: Callable[[list[str]], np.ndarray] | None = None,
) -> Overlay:
    """The delta laid over `index` as it stands now: the overlay of the last call when the file
    did not change, extended by the records appended since when it grew, rebuilt from scratch
    when it was rewritten (`compact`, a lost file) or `index` is another version."""
    epoch, generation, records = delta_file(index_dir).read()
    folder = str(resolved(index_dir))
    with _overlays_lock:
        cached = _overlays.get(folder)
    if cached is not None and (cached.version, cached.epoch) == (index.folder.name, epoch):
        if cached.generation == generation:
            return cached.overlay
        overlay = extend_overlay(cached.overlay, index, records[cached.count :], embed)
    else:
        overlay = None
    if overlay is None:
        overlay = build_overlay(index, records, embed)
    with _overlays_lock:
        _overlays[folder] = _Cached(index.folder.name, epoch, generation, len(records), overlay)
    return overlay


def compact(index_dir: Path, index: PublishedIndex) -> int:
    """Rewrite the delta without the records `index` holds, when there are enough of them.
    Call under the journal's lock; returns how many records were dropped."""
    _, records = delta_file(index_dir).snapshot()
    indexed_turns = _IndexedTurns(index)
    kept = [r for r in records if not _held(r, index, indexed_turns)]
    if len(records) - len(kept) < COMPACT_AFTER:
        return 0
    return _rewrite(index_dir, records, kept)


def drop_laid_turns(index_dir: Path, paths: Iterable[str]) -> int:
    """Rewrite the delta without the turns laid from `paths` (files the store has just deleted
    or re-read): a deleted file's turns must not stay searchable until a version is published
    (none is when the store is back where the live version was). Call under the journal's
    lock; returns how many records were dropped."""
    gone = set(paths)
    if not gone or not delta_path(index_dir).exists():
        return 0
    _, records = delta_file(index_dir).snapshot()
    kept = [
        r for r in records
        if not (r.get("event") == EARLY_TURN_EVENT and r["memory"].get("path") in gone)
    ]  # fmt: skip
    if len(kept) == len(records):
        return 0
    return _rewrite(index_dir, records, kept)


def _rewrite(index_dir: Path, records: list[dict[str, Any]], kept: list[dict[str, Any]]) -> int:
    """Replace the delta file by `kept` (atomically, fsynced); how many records went."""
    dropped = len(records) - len(kept)
    if not kept or kept[-1]["seq"] != records[-1]["seq"]:
        # Keep the position: a writer compares it with the journal's (`live_writer`).
        kept.append(record(int(records[-1]["seq"]), datetime.now(UTC), "mark", None, {}))
    path = delta_path(index_dir)
    staging = path.with_name(f".{DELTA_FILE}.{os.getpid()}.tmp")
    staging.write_text("".join(_dumps(r) + "\n" for r in kept), encoding="utf-8")
    with open(staging, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(staging, path)
    return dropped
