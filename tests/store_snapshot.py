"""Every table of a store as comparable rows: what two runs that should build the same store
(the Dagster job and the library, before and after a speed change) are compared on.

Random ids (facts, entities, relations, history, events) and wall-clock times differ from run
to run, so each row is written with ids replaced by what they stand for (a memory by its kind,
conversation and content; an entity by its name and type) and without the clock columns; a
table is then a sorted list of such rows. Rows that really differ still differ.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb

#: Columns that hold the time a row was written, not what it says.
CLOCK_COLUMNS = frozenset(
    {
        "ts",
        "created_at",
        "updated_at",
        "indexed_at",
        "first_seen_at",
        "consolidated_at",
        "recorded_at",
        "checked_at",
        "last_accessed",
        "valid_until",
        "purge_at",
    }
)
#: Tables of bookkeeping about the store itself (schema version, fingerprints of the index).
SKIPPED_TABLES = frozenset({"store_meta"})
_RANDOM_ID = re.compile(
    r"\b(?:(?:fact|ent|rel|hist|chg|evt|sum|ref|ins|proc)_[0-9a-f]{20}|[0-9a-f]{32})\b"
)
#: JSON keys that hold hashes of random ids (a summary's input includes its facts' ids).
DERIVED_KEYS = frozenset({"source_fingerprint"})


def store_tables(db_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """table name → its rows, sorted, with random ids named by what they stand for."""
    with duckdb.connect(str(db_path), read_only=True) as con:
        names = _names(con)
        tables = [
            row[0]
            for row in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                "AND table_type = 'BASE TABLE' ORDER BY 1"
            ).fetchall()
            if row[0] not in SKIPPED_TABLES
        ]
        out: dict[str, list[tuple[Any, ...]]] = {}
        for table in tables:
            cursor = con.execute(f"SELECT * FROM {table}")
            columns = [d[0] for d in cursor.description]
            rows = []
            for row in cursor.fetchall():
                values = []
                for column, value in zip(columns, row, strict=True):
                    if column in CLOCK_COLUMNS:
                        values.append(value is None)  # whether it is set, not when
                    else:
                        values.append(_stable(value, names))
                rows.append(tuple(values))
            out[table] = sorted(rows, key=repr)
    return out


def differences(left: Path, right: Path, limit: int = 5) -> dict[str, str]:
    """Per differing table, the row counts and a few rows found in only one of the stores."""
    a, b = store_tables(left), store_tables(right)
    found: dict[str, str] = {}
    for table in sorted(set(a) | set(b)):
        rows_a, rows_b = a.get(table, []), b.get(table, [])
        if rows_a == rows_b:
            continue
        set_a, set_b = set(rows_a), set(rows_b)
        only_a = [r for r in rows_a if r not in set_b][:limit]
        only_b = [r for r in rows_b if r not in set_a][:limit]
        found[table] = (
            f"{len(rows_a)} vs {len(rows_b)} rows; only left {only_a}; only right {only_b}"
        )
    return found


def _names(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Random id → what it stands for."""
    names = {
        memory_id: f"{kind}|{conversation}|{content}|{sorted(sources or [])}"
        for memory_id, kind, conversation, content, sources in con.execute(
            "SELECT id, kind, conversation_id, content, source_ids FROM memories"
        ).fetchall()
    }
    names |= {
        entity_id: f"entity|{name}|{kind}"
        for entity_id, name, kind in con.execute(
            "SELECT id, canonical_name, type FROM entities"
        ).fetchall()
    }
    names |= {
        relation_id: f"relation|{names.get(a, a)}|{names.get(b, b)}"
        for relation_id, a, b in con.execute("SELECT id, from_id, to_id FROM relations").fetchall()
    }
    return names


def _stable(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        if value.startswith(("{", "[")):
            try:
                return _stable_json(json.loads(value), names)
            except json.JSONDecodeError:
                pass
        return _RANDOM_ID.sub(lambda m: names.get(m.group(0), "<id>"), value)
    if isinstance(value, list):
        return tuple(_stable(v, names) for v in value)
    if isinstance(value, dict):
        return _stable_json(value, names)
    return value


def _stable_json(value: Any, names: dict[str, str]) -> str:
    def clean(item: Any) -> Any:
        if isinstance(item, dict):
            return {
                k: clean(v)
                for k, v in sorted(item.items())
                if not k.endswith("_at") and k not in DERIVED_KEYS
            }
        if isinstance(item, list):
            return [clean(v) for v in item]
        return _stable(item, names) if isinstance(item, str) else item

    return json.dumps(clean(value), sort_keys=True, default=str)
