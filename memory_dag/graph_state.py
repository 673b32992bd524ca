"""Whether the whole graph has anything to do: the store's *settled* version.

A run of every stage (files → chunks → facts → entities → summaries → embeddings → both
indexes) leaves the store settled: each derived table and the published index agree with
the inputs. Finding that out stage by stage costs every stage its fixed price (a store open,
a fingerprint over 100k rows, a model load): seconds at 100k turns for a run that does
nothing. So the last stage of a whole run records what it settled on (`record_settled`), and
the next run's first stage asks `work_due` after reading the workspace: when the store still
has that version, the published index is still the one recorded, no live write waits in the
journal and nothing is forced, nothing downstream has anything to do.

The version is cheap (a few aggregates): the files the store read (path and content hash), the
memories (count, soft-deletions, newest creation), every write's `history` row, the entities
and their links, the chunks and cached embeddings (counts), the sessions and their
consolidation, the folded journal position and the embedding model. A write by anything else
(a maintenance job, a stage run alone from the UI, a crash half-way through a run) changes it,
so the next run runs every stage again (each is incremental). The settled record is taken
before the index builds and written after them only if the store did not change meanwhile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_dag.config import Settings
from memory_dag.ids import digest
from memory_dag.memories.journal import JOURNAL_SEQ_KEY, Journal
from memory_dag.store.connection import get_meta, open_store, set_meta

#: What a run that found nothing to do says (a note of the files stage, the CLI's line).
NOTHING_DUE = "nothing changed since the graph last settled: the later stages were not run"
#: store_meta key of the settled record: {"store": version, "index": manifest fingerprint}.
SETTLED_KEY = "graph_settled"

_VERSION_SQL = """
SELECT
    (SELECT count(*) || ':' || coalesce(md5(string_agg(path || ':' || hash, ',' ORDER BY path)), '')
       FROM files),
    (SELECT count(*) || ':' || count(valid_until) || ':' || coalesce(max(created_at)::TEXT, '')
       FROM memories),
    (SELECT count(*) FROM history),
    (SELECT count(*) FROM memory_entities),
    (SELECT count(*) FROM entities),
    (SELECT count(*) FROM chunks),
    (SELECT count(*) FROM embedding_cache),
    (SELECT count(*) || ':' || count(consolidated_at) FROM sessions_consolidations),
    (SELECT coalesce(max(value), '') FROM store_meta WHERE key = ?)
"""


@dataclass
class Due:
    """What a run has to do; empty `reasons` means nothing."""

    reasons: list[str] = field(default_factory=list)
    #: The settled record as stored (`SETTLED_KEY`'s raw value; "" when never settled).
    settled: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasons)


def store_version(con: Any, settings: Settings) -> str:
    """A fingerprint of everything the graph's stages read and write (a few aggregates)."""
    from memory_dag.embed.providers import get_provider  # NumPy: not before a run needs it

    row = con.execute(_VERSION_SQL, [JOURNAL_SEQ_KEY]).fetchone()
    provider = get_provider(settings)
    return digest(provider.name, provider.model, *(str(value) for value in row))


def index_fingerprint(settings: Settings) -> str:
    """The live version's fingerprint, from its manifest alone (`index.published` imports
    FAISS and Polars: half a second a run that may have nothing to do)."""
    index_dir = Path(settings.index_dir)
    try:
        name = (index_dir / "CURRENT").read_text().strip()
        manifest = json.loads((index_dir / name / "manifest.json").read_text()) if name else {}
    except FileNotFoundError:
        return ""
    return str(manifest.get("fingerprint", ""))


def work_due(settings: Settings, *, force: bool = False) -> Due:
    """Why the stages after the files stage must run (after it has read the workspace)."""
    due = Due()
    if force:
        due.reasons.append("forced")
    if not Path(settings.db_path).exists():
        due.reasons.append("no store yet")
        return due
    with open_store(settings.db_path, read_only=True) as con:
        raw = get_meta(con, SETTLED_KEY)
        version = store_version(con, settings)
        folded = int(get_meta(con, JOURNAL_SEQ_KEY) or 0)
    due.settled = raw or ""
    settled = json.loads(raw) if raw else {}
    if not settled:
        due.reasons.append("the graph never settled on this store")
    elif settled.get("store") != version:
        due.reasons.append("the store changed since the graph last settled")
    if settled and settled.get("index") != index_fingerprint(settings):
        due.reasons.append("the published index is not the one the graph settled on")
    if Journal(settings.workspace).last_seq() > folded:
        due.reasons.append("live writes wait in the journal")
    return due


def settled_record(settings: Settings) -> str:
    """The settled record as stored ("" when the graph never settled on this store)."""
    with open_store(settings.db_path, read_only=True) as con:
        return get_meta(con, SETTLED_KEY) or ""


def settle_token(settings: Settings) -> str:
    """The store's version before the index builds (`record_settled` compares it after)."""
    with open_store(settings.db_path, read_only=True) as con:
        return store_version(con, settings)


def record_settled(settings: Settings, token: str) -> bool:
    """Record that the graph settled on `token`, unless the store changed since it was taken
    (a write between the builds: the next run then runs every stage). True when recorded."""
    with open_store(settings.db_path) as con:
        if store_version(con, settings) != token:
            return False
        record = {"store": token, "index": index_fingerprint(settings)}
        set_meta(con, SETTLED_KEY, json.dumps(record, sort_keys=True))
    return True
