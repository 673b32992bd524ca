"""Entity links of written memories (seed 004 `create_or_get_entity`), written at commit.

* Entities resolve by canonical name + type, then by alias (seed 004); a new spelling becomes an
  alias. An entity first seen as a bare capitalised name (type `other`) takes the type of a later
  confident mention (`TYPE_UPGRADE_CONFIDENCE`): "Anne called" then "my wife is Anne" -> person.
  A fact is also linked to its speaker (a person) when it names them: the extractor's heuristics
  miss a bare sentence-initial name ("Sam now hates pizza.").
* Links get no `history` row: they are derived, re-computable data (a LINK row per episode
  would swamp the history) and `memory_entities` carries `created_at`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from memory_dag.ids import random_id
from memory_dag.memories.entities import (
    NAME_TYPES,
    EntityMention,
    canonical_name,
    deduplicate_overlaps,
    extract_entities_iter,
    resolve,
)
from memory_dag.store.connection import insert_arrow, listed

#: An entity of type `other` takes a specific type from a mention at least this confident:
#: "my wife Anne" (0.9) makes "Anne" a person; "working on Jon's business" (0.8) must not make
#: "Jon" a project.
TYPE_UPGRADE_CONFIDENCE = 0.85
#: Confidence of "the speaker of a fact is a person named in it" (above every extractor cue).
SPEAKER_CONFIDENCE = 0.95

_TS = pa.timestamp("us", tz="UTC")
_ENTITY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("canonical_name", pa.string()),
        ("type", pa.string()),
        ("aliases", pa.list_(pa.string())),
        ("mention_count", pa.int64()),
        ("created_at", _TS),
        ("updated_at", _TS),
    ]
)
_CHANGE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("aliases", pa.list_(pa.string())),
        ("added", pa.int64()),
    ]
)
_LINK_SCHEMA = pa.schema(
    [
        ("memory_id", pa.string()),
        ("entity_id", pa.string()),
        ("mention", pa.string()),
        ("provider", pa.string()),
        ("created_at", _TS),
    ]
)


@dataclass
class _Entity:
    id: str
    canonical_name: str
    type: str
    aliases: list[str]
    new: bool = False
    added: int = 0  # links added in this flush
    dirty: bool = False  # aliases or type changed
    #: The canonical name and aliases casefolded: is a spelling new? (kept with `aliases`)
    folded: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.folded = {self.canonical_name.casefold(), *(a.casefold() for a in self.aliases)}


class EntityLinker:
    """Queues (memory id, text) pairs during a transaction and links them at `flush`.

    `count(key, amount)` adds to the writer's counts (entities_created, entity_links,
    memories_linked).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, count: Callable[[str, int], None]) -> None:
        self.con = con
        self._count = count
        self._pending: list[tuple[str, str]] = []
        self._speakers: dict[str, str] = {}  # fact id -> the person it is about
        self._entities: dict[str, _Entity] | None = None
        self._entity_names: dict[str, set[str]] = {}
        #: What each mention resolved to since the entities last changed (none added, renamed
        #: or retyped): said again, it resolves the same. A run says few distinct mentions
        #: many times (166k mentions at 100k turns): resolving each anew was most of the
        #: stage's serial work.
        self._resolved: dict[tuple[str, str, str, bool], _Entity] = {}

    def queue(self, items: Sequence[tuple[str, str]]) -> None:
        self._pending.extend(items)

    def note_speaker(self, memory_id: str, speaker: str) -> None:
        """The fact `memory_id` is about `speaker`: link it to them when the text names them."""
        self._speakers[memory_id] = speaker

    def flush(self) -> None:
        if self._pending:
            self._write_links(self._pending)
            self._pending = []
            self._speakers = {}

    def reset(self) -> None:
        """Drop what is queued and the loaded entities (the transaction rolled back)."""
        self._pending.clear()
        self._speakers.clear()
        self._entities = None
        self._resolved.clear()

    def _load_entities(self) -> dict[str, _Entity]:
        if self._entities is None:
            self._entities = {}
            self._entity_names = {}
            self._resolved = {}
            rows = self.con.execute(
                "SELECT id, canonical_name, type, aliases FROM entities"
            ).fetchall()
            for entity_id, name, kind, aliases in rows:
                self._index_entity(_Entity(entity_id, name, kind, list(aliases or [])))
        return self._entities

    def _index_entity(self, entity: _Entity) -> None:
        assert self._entities is not None
        self._entities[entity.id] = entity
        for name in [entity.canonical_name, *entity.aliases]:
            self._entity_names.setdefault(name.strip().casefold(), set()).add(entity.id)

    def _resolve_entity(self, mention: Any) -> _Entity:
        """Seed 004 `create_or_get_entity`: canonical name + type, then alias; else a new one.

        The same mention resolves as it did last time while no entity changed since
        (`_resolved`): its result, and what it changed, would be the same."""
        strong = mention.confidence >= TYPE_UPGRADE_CONFIDENCE
        key = (mention.canonical, mention.text, mention.type, strong)
        entities = self._load_entities()
        entity = self._resolved.get(key)
        if entity is None:
            entity, changed = self._resolve_uncached(mention, entities)
            if changed:  # another mention may now resolve otherwise
                self._resolved.clear()
            self._resolved[key] = entity
        return entity

    def _resolve_uncached(self, mention: Any, entities: dict[str, _Entity]) -> tuple[_Entity, bool]:
        """The entity `mention` refers to, and whether an entity was added or changed."""
        changed = False
        keys = {mention.canonical.casefold(), mention.text.strip().casefold()}
        candidate_ids = set().union(*(self._entity_names.get(key, set()) for key in keys))
        known = resolve(mention, [entities[i] for i in candidate_ids])
        if known is None:
            entity = _Entity(random_id("ent_"), mention.canonical, mention.type, [], new=True)
            self._index_entity(entity)
            self._count("entities_created", 1)
            changed = True
        else:
            entity = known
            if (
                entity.type == "other"
                and mention.type in NAME_TYPES - {"other"}
                and mention.confidence >= TYPE_UPGRADE_CONFIDENCE
                and not any(
                    e.canonical_name == entity.canonical_name and e.type == mention.type
                    for e in entities.values()
                )
            ):
                entity.type = mention.type  # a strong cue told us what the bare name is
                entity.dirty = changed = True
        alias = " ".join(mention.text.split())
        if alias and alias.casefold() not in entity.folded:
            entity.aliases.append(alias)
            entity.folded.add(alias.casefold())
            entity.dirty = changed = True
            self._entity_names.setdefault(alias.casefold(), set()).add(entity.id)
        return entity, changed

    def _mentions(
        self, memory_id: str, text: str, mentions: list[EntityMention]
    ) -> list[EntityMention]:
        """The fast extractor's entities (`mentions`), plus the speaker of a fact named in it:
        a fact is about the person who said it, whatever the capitalisation heuristics make of
        the name ("Sam now hates pizza." has no cue that "Sam" is a name)."""
        speaker = self._speakers.get(memory_id)
        found = re.search(rf"\b{re.escape(speaker)}\b", text) if speaker else None
        if not (speaker and found):
            return mentions  # as the extractor left them: without overlaps already
        # Every use of the speaker's name is the speaker ("Jon is working on Jon's business"
        # must not make a project called Jon).
        name = canonical_name(speaker, "person")
        mentions = [m for m in mentions if m.canonical != name]
        mentions.append(
            EntityMention(
                text=speaker,
                canonical=name,
                type="person",
                start=found.start(),
                end=found.end(),
                confidence=SPEAKER_CONFIDENCE,
                provider="speaker",
            )
        )
        return deduplicate_overlaps(mentions)

    def _write_links(self, items: list[tuple[str, str]]) -> None:
        memory_ids = list(dict.fromkeys(memory_id for memory_id, _ in items))
        with listed(self.con, "_linked_ids", memory_ids):  # one view for the three statements
            self._write_links_of(items, memory_ids)

    def _write_links_of(self, items: list[tuple[str, str]], memory_ids: list[str]) -> None:
        """`_write_links` with `memory_ids` readable as the view `_linked_ids`."""
        texts = dict(items)
        # The worker processes start on the texts now; their mentions are resolved here, in
        # order, as they come.
        extracted = extract_entities_iter(list(texts.values()))
        # Memories processed again (a re-ingested episode) lose their old links first.
        self.con.execute(
            "UPDATE entities SET mention_count = entities.mention_count - gone.n "
            "FROM (SELECT entity_id, count(*) AS n FROM memory_entities "
            "      WHERE memory_id IN (SELECT value FROM _linked_ids) GROUP BY entity_id) gone "
            "WHERE entities.id = gone.entity_id"
        )
        self.con.execute(
            "DELETE FROM memory_entities WHERE memory_id IN (SELECT value FROM _linked_ids)"
        )
        now = datetime.now(UTC)
        links: list[dict[str, Any]] = []
        touched: dict[str, _Entity] = {}
        for (memory_id, text), found in zip(texts.items(), extracted, strict=True):
            linked: set[str] = set()
            for mention in self._mentions(memory_id, text, found):
                entity = self._resolve_entity(mention)
                touched[entity.id] = entity
                if entity.id in linked:
                    continue
                linked.add(entity.id)
                entity.added += 1
                links.append(
                    {
                        "memory_id": memory_id,
                        "entity_id": entity.id,
                        "mention": mention.text,
                        "provider": mention.provider,
                        "created_at": now,
                    }
                )
        new_rows = [
            {
                "id": e.id,
                "canonical_name": e.canonical_name,
                "type": e.type,
                "aliases": e.aliases,
                "mention_count": e.added,
                "created_at": now,
                "updated_at": now,
            }
            for e in touched.values()
            if e.new
        ]
        changed_rows = [
            {"id": e.id, "type": e.type, "aliases": e.aliases, "added": e.added}
            for e in touched.values()
            if not e.new and (e.added or e.dirty)
        ]
        if new_rows:
            insert_arrow(self.con, "entities", pa.Table.from_pylist(new_rows, _ENTITY_SCHEMA))
        if changed_rows:
            self.con.register("_entity_changes", pa.Table.from_pylist(changed_rows, _CHANGE_SCHEMA))
            try:
                self.con.execute(
                    "UPDATE entities SET mention_count = entities.mention_count + c.added, "
                    "type = c.type, aliases = c.aliases, updated_at = ? "
                    "FROM _entity_changes c WHERE entities.id = c.id",
                    [now],
                )
            finally:
                self.con.unregister("_entity_changes")
        if links:
            insert_arrow(self.con, "memory_entities", pa.Table.from_pylist(links, _LINK_SCHEMA))
        self.con.execute(
            "UPDATE memories SET attributes = json_merge_patch(coalesce(attributes, '{}'::JSON), "
            "json_object('entities_at', ?::VARCHAR)) WHERE id IN (SELECT value FROM _linked_ids)",
            [now.isoformat()],
        )
        for entity in touched.values():
            entity.new = entity.dirty = False
            entity.added = 0
        self._count("entity_links", len(links))
        self._count("memories_linked", len(memory_ids))
