"""What the store knows that the published index may not (yet): memories soft-deleted or
expired since the index was built, live relations, entity links of the query's names, and
transcript turns a newer statement superseded (`lookups.superseded_turns`).

Read once per store version (a short read-only connection), never while a pipeline holds
the store for longer than the caller allows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memory_dag.ids import episode_id
from memory_dag.index.delta import Overlay
from memory_dag.index.search import SearchHit
from memory_dag.memories.entities import extract_entities
from memory_dag.memories.lookups import superseded_turns
from memory_dag.paths import resolved
from memory_dag.read.results import Candidate, RelatedMemory
from memory_dag.store.connection import StoreLockedError, listed, open_store


@dataclass
class StoreSignals:
    """What the store knows about memories that the published index may not (yet)."""

    #: (size, mtime) of the store file and its WAL when this was read.
    signature: tuple[int, ...] = ()
    #: Ids of soft-deleted or expired memories.
    dead: set[str] = field(default_factory=set)
    #: memory id → [(related live memory id, strength)], strongest first, either direction.
    edges: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    #: memory id → how many entities named by the query it is linked to (per query).
    entity_matches: dict[str, int] = field(default_factory=dict)
    #: episode id → the memory that superseded what the turn said (None: forgotten).
    superseded: Mapping[str, str | None] = field(default_factory=dict)
    #: episode id → the active facts drawn from it.
    facts_of: Mapping[str, list[str]] = field(default_factory=dict)


def store_signature(db_path: Path) -> tuple[int, ...] | None:
    """Changes whenever DuckDB writes the store (the file or its WAL); None: no store."""
    parts: list[int] = []
    for path in (db_path, db_path.with_name(db_path.name + ".wal")):
        try:
            stat = path.stat()
        except FileNotFoundError:
            if path == db_path:
                return None
            continue
        parts += [stat.st_size, stat.st_mtime_ns]
    return tuple(parts)


_snapshots: dict[Path, StoreSignals] = {}
_snapshots_lock = threading.Lock()


def store_snapshot(db_path: Path, lock_timeout: float = 0.0) -> tuple[StoreSignals | None, str]:
    """Inactive ids and live relations of the store, read again only after it changed.

    A short read-only connection costs tens of milliseconds (more on a busy machine), so the
    hot path reads the whole of both once per store version, as the index is loaded once per
    version. While a pipeline holds the store the last snapshot is used, or none.
    """
    signature = store_signature(db_path)
    if signature is None:
        return None, "no store"
    key = resolved(db_path)
    with _snapshots_lock:
        cached = _snapshots.get(key)
        if cached is not None and cached.signature == signature:
            return cached, "snapshot"
        try:
            with open_store(db_path, read_only=True, lock_timeout=lock_timeout) as con:
                snapshot = _read_snapshot(con, signature)
        except StoreLockedError:
            if cached is not None:
                return cached, "store busy: the last snapshot"
            return None, "store busy (a pipeline holds it)"
        _snapshots[key] = snapshot
        return snapshot, "read"


def _read_snapshot(con: Any, signature: tuple[int, ...]) -> StoreSignals:
    dead = con.execute(
        "SELECT id FROM memories WHERE valid_until IS NOT NULL OR state <> 'active'"
    ).fetchall()
    edges = con.execute(
        """
        SELECT r.from_id, r.to_id, r.strength
        FROM relations r
        JOIN memories a ON a.id = r.from_id JOIN memories b ON b.id = r.to_id
        WHERE a.valid_until IS NULL AND a.state = 'active'
          AND b.valid_until IS NULL AND b.state = 'active'
        ORDER BY r.strength DESC, r.from_id, r.to_id
        """
    ).fetchall()
    drawn = con.execute(
        "SELECT unnest(source_ids) AS episode, id FROM memories WHERE kind = 'fact' "
        "AND valid_until IS NULL AND state = 'active' ORDER BY 1, 2"
    ).fetchall()
    facts_of: dict[str, list[str]] = {}
    for episode, fact in drawn:
        facts_of.setdefault(episode, []).append(fact)
    snapshot = StoreSignals(
        signature=signature,
        dead={row[0] for row in dead},
        superseded=superseded_turns(con),
        facts_of=facts_of,
    )
    for from_id, to_id, strength in edges:
        snapshot.edges.setdefault(from_id, []).append((to_id, strength))
        snapshot.edges.setdefault(to_id, []).append((from_id, strength))
    return snapshot


def with_live_writes(snapshot: StoreSignals, overlay: Overlay) -> StoreSignals:
    """The store's signals with the newer word of live writes (the delta segment) on top:
    what they forgot or replaced is dead and supersedes its turns, what they restored lives.

    `superseded` and `facts_of` are views that merge the two on lookup: a search reads a few
    dozen episodes of them, while merging every episode of a large store cost ~5-12 ms a call.
    """
    return replace(
        snapshot,
        dead=(snapshot.dead | overlay.dead) - overlay.alive,
        superseded=LiveSuperseded(snapshot.superseded, overlay),
        facts_of=LiveFactsOf(snapshot.facts_of, overlay),
        entity_matches={},
    )


class LiveSuperseded(Mapping[str, str | None]):
    """episode id -> what superseded the turn: the store's word, less the episodes whose facts
    live writes made active again, with the live writes' own word over it."""

    def __init__(self, stored: Mapping[str, str | None], overlay: Overlay) -> None:
        self._stored = stored
        self._live = overlay.superseded
        self._released = overlay.released

    def __getitem__(self, episode: str) -> str | None:
        if episode in self._live:
            return self._live[episode]
        if episode in self._released:
            raise KeyError(episode)
        return self._stored[episode]

    def __contains__(self, episode: object) -> bool:
        return episode in self._live or (episode in self._stored and episode not in self._released)

    def __iter__(self) -> Iterator[str]:
        for episode in self._stored:
            if episode not in self._released:
                yield episode
        for episode in self._live:
            if episode not in self._stored or episode in self._released:
                yield episode

    def __len__(self) -> int:
        return sum(1 for _ in self)


class LiveFactsOf(Mapping[str, list[str]]):
    """episode id -> active facts drawn from it: the store's, less those live writes made
    inactive, then the ones live writes drew (each once)."""

    def __init__(self, stored: Mapping[str, list[str]], overlay: Overlay) -> None:
        self._stored = stored
        self._live = overlay.facts_of
        self._dead = overlay.dead

    def __getitem__(self, episode: str) -> list[str]:
        if episode in self._stored:
            known = [fact for fact in self._stored[episode] if fact not in self._dead]
        elif episode in self._live:
            known = []
        else:
            raise KeyError(episode)
        for fact in self._live.get(episode, ()):
            if fact not in known:
                known.append(fact)
        return known

    def __contains__(self, episode: object) -> bool:
        return episode in self._stored or episode in self._live

    def __iter__(self) -> Iterator[str]:
        yield from self._stored
        yield from (episode for episode in self._live if episode not in self._stored)

    def __len__(self) -> int:
        return len(self._stored) + sum(1 for e in self._live if e not in self._stored)


def entity_matches(
    db_path: Path, memory_ids: list[str], names: list[str], lock_timeout: float = 0.0
) -> dict[str, int] | None:
    """memory id → entities among `names` it is linked to; None when the store is busy."""
    if not memory_ids or not names:
        return {}
    try:
        with (
            open_store(db_path, read_only=True, lock_timeout=lock_timeout) as con,
            # The candidates' ids as a view (a bound list costs ~0.1 ms an id); the query's
            # few names stay bound.
            listed(con, "_candidate_memories", memory_ids),
        ):
            rows = con.execute(
                """
                SELECT me.memory_id, count(DISTINCT me.entity_id)
                FROM memory_entities me JOIN entities e ON e.id = me.entity_id
                WHERE me.memory_id IN (SELECT value FROM _candidate_memories)
                  AND (lower(e.canonical_name) IN (SELECT unnest(?::TEXT[]))
                       OR len(list_intersect(list_transform(e.aliases, a -> lower(a)),
                                             ?::TEXT[])) > 0)
                GROUP BY me.memory_id
                """,
                [names, names],
            ).fetchall()
    except (FileNotFoundError, StoreLockedError):
        return None
    return dict(rows)


def memory_ids_of(hit: SearchHit) -> list[str]:
    """The `memories` rows behind a hit: a derived memory, or the episodes of a transcript chunk."""
    if hit.source == "memories":
        return [hit.id]
    if hit.kind == "transcript":
        return [episode_id(hit.path, turn_id) for turn_id in hit.turn_ids]
    return []


def query_entity_names(query: str) -> list[str]:
    """Lower-cased names and canonical forms of the entities a query mentions."""
    names = set()
    for mention in extract_entities(query):
        names.add(mention.text.strip().lower())
        names.add(mention.canonical.strip().lower())
    return sorted(n for n in names if n)


def related_candidates(
    items: list[Candidate], candidates: list[Candidate], signals: StoreSignals | None
) -> list[RelatedMemory]:
    """Candidates linked to a result but not shown, strongest link first.

    Only candidates qualify: they come from the same filtered search, so a relation never
    reaches past the categories or the user the request may read; superseded turns never do.
    """
    if signals is None:
        return []
    by_memory = {i: c for c in candidates for i in c.memory_ids}
    shown = {i for c in items for i in c.memory_ids}
    related: dict[str, RelatedMemory] = {}
    for item in items:
        for memory_id in item.memory_ids:
            for other, strength in signals.edges.get(memory_id, []):
                candidate = by_memory.get(other)
                if candidate is None or other in shown or candidate.superseded:
                    continue
                if other in related and related[other].strength >= strength:
                    continue
                hit = candidate.hit
                related[other] = RelatedMemory(
                    other, candidate.text, hit.category, hit.role, hit.kind, strength, memory_id
                )
    return sorted(related.values(), key=lambda r: -r.strength)
