"""Compare the content of memory stores: row counts and content hashes per table.

Two runs over the same input write the same content but not the same write times or random
ids (history, facts, entities, events get uuid ids; `indexed_at`, `created_at`, `ts` are wall
clock). `content_summary` leaves those columns out, so a sharded run can be checked against a
single-store run of the same users, table by table.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

#: Columns holding generated ids or references to them (uuid-based, differ per run).
GENERATED_ID_COLUMNS = frozenset(
    {
        "id",
        "memory_id",
        "entity_id",
        "from_id",
        "to_id",
        "old_ref",
        "new_ref",
        "result_id",
        "replaced_by",
        "supersedes",
        "source_ids",
        "meta",
        "attributes",
    }
)
#: Time columns that say when something happened rather than when it was written.
CONTENT_TIME_COLUMNS = frozenset({"event_time"})
#: Tables compared (the cache and run bookkeeping are not content).
CONTENT_TABLES = (
    "files",
    "notes",
    "chunks",
    "ingest_errors",
    "memories",
    "entities",
    "relations",
    "history",
    "change_log",
    "conversation_revisions",
    "sessions_consolidations",
    "consent_queue",
)


def _content_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_catalog = 'db' AND table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [
        name
        for name, data_type in rows
        if name not in GENERATED_ID_COLUMNS
        and ("TIMESTAMP" not in data_type.upper() or name in CONTENT_TIME_COLUMNS)
        and not name.endswith("_at")
        and name not in {"mtime", "ts", "rev"}
    ]


def content_summary(db_paths: list[Path]) -> dict[str, tuple[int, str]]:
    """Per table: (row count, hash of the sorted content rows) over these stores together."""
    summary: dict[str, tuple[int, str]] = {}
    con = duckdb.connect()
    try:
        digests: dict[str, list[str]] = {table: [] for table in CONTENT_TABLES}
        for path in db_paths:
            con.execute(f"ATTACH '{path}' AS db (READ_ONLY)")
            try:
                for table in CONTENT_TABLES:
                    columns = ", ".join(f'"{c}"' for c in _content_columns(con, table))
                    digests[table] += [
                        row[0]
                        for row in con.execute(
                            f"SELECT md5(CAST(to_json(struct_pack({columns})) AS VARCHAR)) "
                            f"FROM db.{table}"
                        ).fetchall()
                    ]
            finally:
                con.execute("DETACH db")
        for table, rows in digests.items():
            combined = con.execute(
                "SELECT md5(string_agg(d, ',' ORDER BY d)) FROM unnest(?::VARCHAR[]) AS t(d)",
                [rows],
            ).fetchone()[0]
            summary[table] = (len(rows), combined or "")
    finally:
        con.close()
    return summary
