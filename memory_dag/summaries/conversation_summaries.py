"""A conversation's summary tree in the store: gather its input, replace the tree atomically.

Input (seed 001 §2.4, seed 000 §4.4): every turn of the conversation rendered `Speaker: text`
under a dated header per session (transcript episodes, then `entries/<id>/turns/` notes), the
conversation's shared facts recorded since the last summary (a user's own facts are that
user's, not the conversation's: `memory_dag/scope.py`), and the previous L3 as the rolling
prior. A turn whose statement a newer one superseded (`lookups.superseded_turns`) is marked
`[superseded]`: an LLM reads it as history, and the extractive summarizer never quotes it as
if it were current.

Provenance: every summary row has `source_ids`, what it summarises, so it leads back to its
sources in SQL like a fact does: an L1 (or a BRIEF/STANDARD L3) names the episodes, facts and
entry notes (by path) its part of the input holds, an L2 its L1 rows, an L3 of a tree its L2
(or, DETAILED, L1) rows, and a rolling L3 also the retired summary it continued
(`…:L3:final#g<n>`). `attributes.source_categories` lists the categories of everything under
a node (turns read as the `uncategorized` one): the scope boundary shows a summary only to
agents that may read all of them.

Output: `memories` rows of kind 'summary' with the tree metadata of seed 001 §3.3 in
`attributes` (read them through the `summaries` view). Active rows carry the deterministic ids
`{conversation_id}:summary:L{n}:{index}` (index: chunk for L1, group for L2, `final` for L3).
Every tree has a `generation`; replacing a tree retires the old rows in the same transaction as
the new rows are inserted: they keep their content, get `valid_until`/`state='soft_deleted'`
and the id suffix `#g{generation}`, so the canonical ids are free for the new tree and no
reader ever sees a half-written or doubled tree.

Inputs are gathered, and trees written, for many conversations at once (one query per table,
one transaction); `refresh.py` decides which conversations are due and runs the summarizer
between the two, holding no connection meanwhile (it may call an LLM for minutes).

Kept as one module (~640 lines): gathering a conversation's input, writing its tree in one
transaction and reading it back share one row layout; split, it would be spread over files.

Why one module of ~600 lines: gathering a conversation's input and writing its tree share the row
shapes, ids and provenance; the summarizer itself is `summarizer.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import duckdb
import pyarrow as pa
from pydantic import BaseModel

from memory_dag.collection import collection_paused
from memory_dag.config import Settings
from memory_dag.ingest.sources import Turn, render_turn
from memory_dag.ingest.tokens import count_tokens
from memory_dag.memories.lookups import superseded_turns
from memory_dag.store.connection import (
    fetch_dicts,
    insert_arrow,
    listed,
    open_store,
    registered,
    to_json,
)
from memory_dag.summaries.line_tokens import Counted
from memory_dag.summaries.provenance import Content, Source, chunk_sources
from memory_dag.summaries.summarizer import (
    SUPERSEDED_MARK,
    SummarizerConfig,
    SummaryLevel,
    SummaryResult,
    chunk_text,
)

#: `events.node` of everything recorded here.
EVENT_NODE = "summaries"
#: Who wrote the rows (`memories.source_role`).
WRITER = "summarizer"
CONTENT_TYPE = "conversation"
FACTS_HEADER = "Facts noted since the last summary:"


def summary_id(conversation_id: str, level: int, index: int | str) -> str:
    """The id of an active summary node (seed 001 §3.3)."""
    return f"{conversation_id}:summary:L{level}:{index}"


def final_id(conversation_id: str) -> str:
    return summary_id(conversation_id, 3, "final")


class StoredSummary(BaseModel):
    """One summary row, with its tree metadata as fields."""

    id: str
    conversation_id: str
    content: str
    level: int
    summary_level: SummaryLevel
    generation: int
    is_final: bool = False
    chunk_index: int | None = None
    group_index: int | None = None
    parent_group: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    compression_ratio: float | None = None
    method: str | None = None
    created_at: datetime
    valid_until: datetime | None = None
    replaced_by: str | None = None
    source_fingerprint: str | None = None  # on L3 rows: what the tree was built from
    #: What the node summarises (see the module doc).
    source_ids: list[str] = field(default_factory=list)
    #: Categories of everything under the node; None on rows written before they were kept.
    source_categories: list[str] | None = None

    @property
    def active(self) -> bool:
        return self.valid_until is None


@dataclass(frozen=True)
class ConversationInput:
    """What one summarization of a conversation reads."""

    conversation_id: str
    content: str
    turns: int
    sessions: int
    facts: int  # facts in `content`: those recorded since the last summary
    prior: StoredSummary | None
    #: Identifies the source material (all turns, all facts) and the summarizer: unchanged
    #: means a new summary would say the same, so the run is skipped.
    fingerprint: str
    #: Where each turn, fact and entry sits in `content`, in order.
    sources: tuple[Source, ...] = ()
    #: (start, end, tokens) of the turns in `content` whose token counts are known (counted
    #: when they were chunked): `summarizer.summarize`'s `counted`.
    counted: tuple[Counted, ...] = ()


@dataclass
class SummaryRun:
    """What `summarize_conversation` did, for the CLI, the benchmark and run metadata."""

    conversation_id: str
    status: Literal["written", "unchanged", "none"]
    level: SummaryLevel
    method: str
    input_tokens: int
    output_tokens: int
    compression_ratio: float
    turns: int
    sessions: int
    facts: int
    l1: int = 0
    l2: int = 0
    generation: int | None = None
    retired: int = 0
    final_id: str | None = None
    preview: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        if self.status == "unchanged":
            state = f"unchanged since generation {self.generation}, skipped"
        else:
            state = (
                f"{self.level.value:<12} {self.input_tokens:>6} -> {self.output_tokens:>5} tokens "
                f"(ratio {self.compression_ratio:.3f}, L1 {self.l1}, L2 {self.l2}, {self.method})"
            )
        return f"{self.conversation_id:<20} {state}  ({sum(self.seconds.values()):.2f}s)"


# --- Gathering -----------------------------------------------------------------------------------


def conversation_ids(settings: Settings) -> list[str]:
    """Every conversation with turns or entries in the store, sorted."""
    with open_store(settings.db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT DISTINCT conversation_id FROM episodes WHERE conversation_id IS NOT NULL "
            "UNION SELECT DISTINCT conversation_id FROM notes "
            "WHERE kind = 'entry' AND conversation_id IS NOT NULL"
        ).fetchall()
    return sorted(row[0] for row in rows)


def gather_input(
    con: duckdb.DuckDBPyConnection, conversation_id: str, summarizer: str
) -> ConversationInput:
    """Read a conversation's turns, shared facts and prior L3 into the summarizer's input."""
    return gather_inputs(con, [conversation_id], summarizer)[0]


@collection_paused()
def gather_inputs(
    con: duckdb.DuckDBPyConnection, conversation_ids: Sequence[str], summarizer: str
) -> list[ConversationInput]:
    """`gather_input` of many conversations, with one query per table for all of them."""
    ids = list(conversation_ids)
    # The conversations' ids and their L3 ids as views: a bound list costs ~0.1 ms a value.
    with listed(con, "_conversations", ids), listed(con, "_finals", [final_id(c) for c in ids]):
        priors = {
            summary.conversation_id: summary
            for summary in _load(
                con,
                "id IN (SELECT value FROM _finals) AND valid_until IS NULL AND state = 'active'",
                [],
            )
            if summary.id == final_id(summary.conversation_id)
        }
        # With each turn, its token count when its chunk is the turn's line alone (the
        # default: one turn a chunk), counted when it was chunked: the summarizer needs not
        # encode it again. The text must match (the chunks may be older than the turn).
        episodes = _grouped(
            con,
            "WITH turns AS (SELECT conversation_id, id, turn_id, session_id, role, speaker, "
            "content, line, path, CASE WHEN speaker <> '' THEN speaker || ': ' || content END "
            "AS line_text FROM episodes "
            "WHERE conversation_id IN (SELECT value FROM _conversations)), "
            "counted AS (SELECT path, start_line, text, min(tokens) AS tokens FROM chunks "
            "WHERE end_line = start_line AND path IN (SELECT path FROM turns) GROUP BY ALL) "
            "SELECT t.conversation_id, t.id, t.turn_id, t.session_id, t.role, t.speaker, "
            "t.content, t.line, t.path, c.tokens FROM turns t LEFT JOIN counted c "
            "ON c.path = t.path AND c.start_line = t.line AND c.text = t.line_text "
            "ORDER BY t.conversation_id, t.path, t.line",
            [],
        )
        # Each session's first time, not every turn's: a timestamp costs the client a time
        # zone lookup (100k turns: ~0.5 s), and only the first is shown or compared.
        starts: dict[str, dict[str, datetime | None]] = {}
        for conversation_id, path, first in con.execute(
            "SELECT conversation_id, path, min(event_time) FROM episodes "
            "WHERE conversation_id IN (SELECT value FROM _conversations) GROUP BY ALL"
        ).fetchall():
            starts.setdefault(conversation_id, {})[path] = first
        entry_turns = _grouped(
            con,
            "SELECT conversation_id, path, entry_id, role, body, created_at FROM notes "
            "WHERE kind = 'entry' AND conversation_id IN (SELECT value FROM _conversations) "
            "AND role IN ('user', 'assistant') AND path LIKE 'entries/%/turns/%' "
            "ORDER BY conversation_id, created_at NULLS LAST, path",
            [],
        )
        facts = _grouped(
            con,
            "SELECT conversation_id, id, content, created_at, category FROM facts "
            "WHERE conversation_id IN (SELECT value FROM _conversations) AND user_id IS NULL "
            "UNION ALL "
            "SELECT conversation_id, path AS id, trim(body) AS content, created_at, "
            "NULL AS category FROM notes "
            "WHERE kind = 'entry' AND conversation_id IN (SELECT value FROM _conversations) "
            "AND role = 'memory' AND path LIKE 'entries/%/facts/%' "
            "ORDER BY conversation_id, created_at NULLS FIRST, id",
            [],
        )
        superseded = superseded_turns(con, ids)
    return [
        _input_of(
            conversation_id,
            summarizer,
            priors.get(conversation_id),
            episodes.get(conversation_id, []),
            starts.get(conversation_id, {}),
            entry_turns.get(conversation_id, []),
            facts.get(conversation_id, []),
            superseded,
        )
        for conversation_id in ids
    ]


def _grouped(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]
) -> dict[str, list[dict[str, Any]]]:
    """Rows (as dicts without their first column) grouped by that first column."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in fetch_dicts(con, sql, params):
        groups.setdefault(row.pop("conversation_id"), []).append(row)
    return groups


def _input_of(
    conversation_id: str,
    summarizer: str,
    prior: StoredSummary | None,
    episodes: list[dict[str, Any]],
    starts: Mapping[str, datetime | None],
    entry_turns: list[dict[str, Any]],
    facts: list[dict[str, Any]],
    superseded: Mapping[str, str | None],
) -> ConversationInput:
    since = prior.created_at if prior is not None else None
    sessions: dict[str, list[dict[str, Any]]] = {}
    for row in episodes:
        sessions.setdefault(row["path"], []).append(row)
    built = Content()
    line_tokens: dict[int, int] = {}  # a turn's place in `built.sources` -> its token count
    for number, rows in enumerate(_ordered_sessions(sessions, starts)):
        built.add(("\n\n" if number else "") + _session_header(rows, starts.get(rows[0]["path"])))
        for row in rows:
            built.add("\n" + (SUPERSEDED_MARK if row["id"] in superseded else ""))
            if row.get("tokens") is not None:
                line_tokens[len(built.sources)] = row["tokens"]
            built.add(render_turn(_turn(row)), row["id"])
    if entry_turns:
        built.add(("\n\n" if sessions else "") + "[conversation entries]")
        for row in entry_turns:
            built.add("\n")
            label = (row["role"] or "user").capitalize()
            built.add(f"{label}: {row['body'].strip()}", row["path"])
    transcript = "".join(built.parts)
    new_facts = [
        row
        for row in facts
        if row["content"] and (since is None or (row["created_at"] and row["created_at"] > since))
    ]
    if new_facts:
        built.add("\n\n" + FACTS_HEADER)
        for row in new_facts:
            built.add("\n- ")
            built.add(row["content"], row["id"], row["category"])
    content, sources = built.text()
    counted = tuple((sources[i].start, sources[i].end, n) for i, n in line_tokens.items())

    digest = hashlib.sha256()
    for part in [summarizer, transcript, *sorted(f"{r['id']}\x00{r['content']}" for r in facts)]:
        digest.update(part.encode("utf-8") + b"\x00")
    return ConversationInput(
        conversation_id=conversation_id,
        content=content,
        turns=len(episodes) + len(entry_turns),
        sessions=len(sessions) + (1 if entry_turns else 0),
        facts=len(new_facts),
        prior=prior,
        fingerprint=digest.hexdigest()[:32],
        sources=sources,
        counted=counted,
    )


def _ordered_sessions(
    sessions: dict[str, list[dict[str, Any]]], starts: Mapping[str, datetime | None]
) -> list[list[dict[str, Any]]]:
    """Sessions in time order (of their first turn: `starts`); undated ones last, in natural
    file order (session_2 < _10)."""

    def key(path: str) -> tuple[bool, datetime, list[Any]]:
        first = starts.get(path)
        natural = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]
        return (first is None, first or datetime.max.replace(tzinfo=UTC), natural)

    return [sessions[path] for path in sorted(sessions, key=key)]


def _session_header(rows: list[dict[str, Any]], when: datetime | None) -> str:
    header = f"[{rows[0]['session_id']}"
    if when is not None:
        header += f", {when.day} {when:%B %Y, %H:%M}"
    return header + "]"


def _turn(row: dict[str, Any]) -> Turn:
    return Turn(
        id=row["turn_id"],
        session_id=row["session_id"],
        conversation_id=None,
        role=row["role"],
        speaker=row["speaker"],
        content=row["content"],
        event_time=None,  # not read: the session's header shows when
        line=row["line"],
    )


def summarizer_identity(config: SummarizerConfig) -> str:
    """Part of the input fingerprint: switching to an LLM (or another model) re-summarizes."""
    # "v2": summaries carry source_ids and source_categories; older trees are rebuilt once.
    # "v3" (extractive): a sentence labelled already gets no second label; rebuilt once.
    if config.llm is None:
        return f"v3/extractive/{config.chunk_size}/{config.chunk_overlap}/{config.group_size}"
    return f"v2/llm:{config.llm.config.model}/{config.chunk_size}/{config.chunk_overlap}"


# --- Summarize and write -------------------------------------------------------------------------


def write_summaries(
    con: duckdb.DuckDBPyConnection, trees: list[tuple[ConversationInput, SummaryResult]]
) -> dict[str, tuple[int | None, int]]:
    """Retire the active trees of these conversations and insert the new ones (inside the
    caller's transaction).

    Returns, per conversation, (generation of the new tree or None for a NONE result, rows
    retired). A NONE result (the conversation is too short) retires the old tree only.
    """
    if not trees:
        return {}
    now = datetime.now(UTC)
    ids = [gathered.conversation_id for gathered, _ in trees]
    with listed(con, "_summarized", ids):
        known = {
            conversation_id: (int(generation), int(active))
            for conversation_id, generation, active in con.execute(
                "SELECT conversation_id, "
                "coalesce(max(CAST(json_extract(attributes, '$.generation') AS INTEGER)), 0), "
                "count(*) FILTER (WHERE valid_until IS NULL AND state = 'active') "
                "FROM memories WHERE kind = 'summary' "
                "AND conversation_id IN (SELECT value FROM _summarized) GROUP BY conversation_id"
            ).fetchall()
        }
    written: dict[str, tuple[int | None, int]] = {}
    retiring: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for gathered, result in trees:
        conversation_id = gathered.conversation_id
        last, active = known.get(conversation_id, (0, 0))
        nodes = _nodes(gathered, result, last + 1)
        written[conversation_id] = (last + 1 if nodes else None, active)
        retiring.append(
            {
                "conversation_id": conversation_id,
                "replaced_by": final_id(conversation_id) if nodes else None,
            }
        )
        rows += [
            {
                "id": node_id,
                "kind": "summary",
                "content": content,
                "conversation_id": conversation_id,
                "source_role": WRITER,
                "created_at": now,
                "importance": 3 if attributes["is_final"] else 2,
                "decay_rate": 0.0,  # summaries are exempt from decay and eviction (seed 000 §4.5)
                "source_ids": source_ids,
                "attributes": to_json(attributes),
            }
            for node_id, content, attributes, source_ids in nodes
        ]
    # Retiring renames the rows: a copy under the new id, then the old row deleted. An UPDATE
    # of the primary key is DuckDB's slow path (100k turns: 5.8 s for 6,200 rows, against 0.2 s).
    with registered(con, "_retiring", pa.Table.from_pylist(retiring, schema=_RETIRING_SCHEMA)):
        con.execute(
            "INSERT INTO memories BY NAME SELECT m.* REPLACE (m.id || '#g' || "
            "coalesce(CAST(json_extract(m.attributes, '$.generation') AS INTEGER), 0) AS id, "
            "?::TIMESTAMPTZ AS valid_until, 'soft_deleted' AS state, r.replaced_by AS replaced_by) "
            "FROM memories m JOIN _retiring r ON m.conversation_id = r.conversation_id "
            "WHERE m.kind = 'summary' AND m.valid_until IS NULL AND m.state = 'active'",
            [now],
        )
        con.execute(
            "DELETE FROM memories WHERE kind = 'summary' AND valid_until IS NULL "
            "AND state = 'active' AND conversation_id IN (SELECT conversation_id FROM _retiring)"
        )
    insert_arrow(con, "memories", pa.Table.from_pylist(rows, schema=_SUMMARY_SCHEMA))
    return written


_RETIRING_SCHEMA = pa.schema([("conversation_id", pa.string()), ("replaced_by", pa.string())])


Node = tuple[str, str, dict[str, Any], list[str]]  # id, content, attributes, source_ids


def _nodes(gathered: ConversationInput, result: SummaryResult, generation: int) -> list[Node]:
    """(id, content, attributes, source_ids) of every node of the result's tree; [] for NONE."""
    if result.summary is None:
        return []
    cid = gathered.conversation_id
    common = {
        "summary_level": result.level.value,
        "method": result.method,
        "generation": generation,
    }
    nodes: list[Node] = []
    categories: dict[str, set[str]] = {}  # node id -> categories under it
    tree = result.hierarchical
    final_sources: list[str]
    if tree is not None:
        chunks = tree.chunks or chunk_text(gathered.content, tree.chunk_size, tree.chunk_overlap)
        covered = chunk_sources(gathered.content, gathered.sources, chunks)
        for l1 in tree.l1_summaries:
            node_id = summary_id(cid, 1, l1.chunk_index)
            sources = covered[l1.chunk_index] if l1.chunk_index < len(covered) else []
            categories[node_id] = {s.category for s in sources}
            attributes = {
                "level": 1,
                "chunk_index": l1.chunk_index,
                "parent_group": l1.parent_group,
                "is_final": False,
                **_tokens(l1.source_tokens, l1.token_count),
                "source_categories": sorted(categories[node_id]),
                **common,
            }
            nodes.append((node_id, l1.content, attributes, [s.id for s in sources]))
        l1_ids = [summary_id(cid, 1, s.chunk_index) for s in tree.l1_summaries]
        final_sources = l1_ids
        l2_tokens = tree.l2_tokens or [count_tokens(text) for text in tree.l2_summaries]
        for index, text in enumerate(tree.l2_summaries):
            node_id = summary_id(cid, 2, index)
            members = [s for s in tree.l1_summaries if s.parent_group == index]
            member_ids = [summary_id(cid, 1, s.chunk_index) for s in members]
            categories[node_id] = set().union(*(categories[i] for i in member_ids))
            attributes = {
                "level": 2,
                "group_index": index,
                "chunk_indices": [s.chunk_index for s in members],
                "is_final": False,
                **_tokens(sum(s.source_tokens for s in members), l2_tokens[index]),
                "source_categories": sorted(categories[node_id]),
                **common,
            }
            nodes.append((node_id, text, attributes, member_ids))
        if tree.l2_summaries:
            final_sources = [summary_id(cid, 2, i) for i in range(len(tree.l2_summaries))]
        under = set().union(*(categories[i] for i in final_sources)) if final_sources else set()
    else:
        final_sources = [source.id for source in gathered.sources]
        under = {source.category for source in gathered.sources}
    prior = gathered.prior
    if prior is not None:  # the rolling summary continues the retired one
        final_sources = [*final_sources, f"{prior.id}#g{prior.generation}"]
        under |= set(prior.source_categories or [])
    final = {
        "level": 3,
        "is_final": True,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "compression_ratio": result.compression_ratio,
        "l1_count": len(tree.l1_summaries) if tree else 0,
        "l2_count": len(tree.l2_summaries) if tree else 0,
        "turns": gathered.turns,
        "sessions": gathered.sessions,
        "facts": gathered.facts,
        "source_fingerprint": gathered.fingerprint,
        "source_categories": sorted(under),
        **common,
    }
    if tree is not None:
        final.update(chunk_size=tree.chunk_size, chunk_overlap=tree.chunk_overlap)
    nodes.append((final_id(cid), result.summary, final, final_sources))
    return nodes


def _tokens(source: int, output: int) -> dict[str, Any]:
    ratio = min(1.0, output / source) if source else 1.0
    return {"input_tokens": source, "output_tokens": output, "compression_ratio": ratio}


_SUMMARY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("kind", pa.string()),
        ("content", pa.string()),
        ("conversation_id", pa.string()),
        ("source_role", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("importance", pa.int32()),
        ("decay_rate", pa.float64()),
        ("source_ids", pa.list_(pa.string())),
        ("attributes", pa.string()),
    ]
)


@dataclass(frozen=True)
class Event:
    """A summarization's `events` row (`record_events`)."""

    conversation_id: str
    status: Literal["ok", "error", "skipped"]
    detail: str
    meta: dict[str, Any]
    memory_id: str | None = None


def record_events(con: duckdb.DuckDBPyConnection, events: Sequence[Event]) -> None:
    """`events` rows of many summarizations in one Arrow insert: bound parameters cost DuckDB's
    client two failed pandas imports a value (~5 ms an event)."""
    rows = [
        {
            "id": uuid.uuid4().hex,
            "conversation_id": event.conversation_id,
            "node": EVENT_NODE,
            "op": "summarize",
            "status": event.status,
            "memory_id": event.memory_id,
            "detail": event.detail,
            "meta": to_json(event.meta),
        }
        for event in events
    ]
    insert_arrow(con, "events", pa.Table.from_pylist(rows, schema=_EVENT_SCHEMA))


_EVENT_SCHEMA = pa.schema(
    [
        (name, pa.string())
        for name in ("id", "conversation_id", "node", "op", "status", "memory_id", "detail", "meta")
    ]
)


# --- Reading ---------------------------------------------------------------------------------


def final_summary(
    conversation_id: str, settings: Settings | None = None, *, lock_timeout: float = 60.0
) -> StoredSummary | None:
    """The conversation's active L3 summary, for injection into prompts (seed 001 §6.3).

    A read path that must not wait for a running pipeline passes `lock_timeout=0` (it then
    gets `StoreLockedError` at once) or calls `read_final_summary` on its own connection.
    """
    settings = settings or Settings.load()
    with open_store(settings.db_path, read_only=True, lock_timeout=lock_timeout) as con:
        return read_final_summary(con, conversation_id)


def summary_tree(
    conversation_id: str, settings: Settings | None = None, *, include_retired: bool = False
) -> list[StoredSummary]:
    """Every node of the active tree (and of retired ones if asked), by level and index."""
    settings = settings or Settings.load()
    where = "" if include_retired else " AND valid_until IS NULL AND state = 'active'"
    with open_store(settings.db_path, read_only=True) as con:
        return _load(con, "conversation_id = ?" + where, [conversation_id])


def read_final_summary(
    con: duckdb.DuckDBPyConnection, conversation_id: str
) -> StoredSummary | None:
    """The active L3 summary, read on an open connection."""
    rows = _load(
        con,
        "conversation_id = ? AND id = ? AND valid_until IS NULL AND state = 'active'",
        [conversation_id, final_id(conversation_id)],
    )
    return rows[0] if rows else None


def _load(con: duckdb.DuckDBPyConnection, where: str, params: list[Any]) -> list[StoredSummary]:
    rows = fetch_dicts(
        con,
        "SELECT id, conversation_id, content, created_at, valid_until, replaced_by, source_ids, "
        f"attributes FROM memories WHERE kind = 'summary' AND {where}",
        params,
    )
    summaries = []
    for row in rows:
        attributes = json.loads(row.pop("attributes") or "{}")
        summaries.append(StoredSummary.model_validate({**attributes, **row}))
    # Active tree first, then retired ones newest first; within a tree by level and index.
    return sorted(
        summaries,
        key=lambda s: (not s.active, -s.generation, s.level, s.chunk_index or s.group_index or 0),
    )
