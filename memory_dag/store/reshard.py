"""Re-sharding (N → M shards): move every row to the shard its route key maps to under M.

`memory-dag reshard --to M`. The new stores are built beside the old ones (each table copied
with DuckDB's ATTACH, filtered by `shard_of(route key, M)`), their indexes are built, and the
result is checked before anything is swapped: every distinct row of every table is in the new
shards and no row is made up (`row_digests`). Only then do the old stores move into a backup
folder (printed; delete it when satisfied) and the new ones into place. A crash before the
swap leaves the old stores untouched; the staging folder is rebuilt by the next attempt.

Rows with no key (shared notes, memories naming neither user nor conversation) go to every
shard; entity names are merged by (name, type), as one store would hold them.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

from memory_dag.config import Settings
from memory_dag.read.access_log import access_log_dir, apply_access_log
from memory_dag.reports import StageReport, StageTimer
from memory_dag.store.connection import open_store
from memory_dag.store.schema import RELATIONS_EDGE_KEY
from memory_dag.store.shards import (
    all_shard_settings,
    read_routes,
    shard_of,
    shards_root,
    write_layout,
    write_routes,
    written_shard_count,
)


def _conversation(column: str) -> str:
    """SQL: the route key of a conversation column (its routed key, else its own key)."""
    return (
        f"CASE WHEN coalesce({column}, '') = '' THEN NULL ELSE coalesce("
        f"(SELECT ck.key FROM _conv_keys ck WHERE ck.conversation_id = {column}), "
        f"'conversation:' || {column}) END"
    )


def _by_memory(column: str, fallback: str = "NULL") -> str:
    return f"coalesce((SELECT mk.key FROM _memory_keys mk WHERE mk.id = t.{column}), {fallback})"


_BY_PATH = "(SELECT pk.key FROM _path_keys pk WHERE pk.path = t.path)"

#: Table → the SQL route key of its row `t` (NULL: shared, copied to every shard).
ROW_KEYS: dict[str, str] = {
    "files": _BY_PATH,
    "notes": _BY_PATH,
    "chunks": _BY_PATH,
    "ingest_errors": _BY_PATH,
    "sessions_consolidations": _BY_PATH,
    "memories": _by_memory("id"),
    "history": _by_memory("memory_id"),
    "memory_entities": _by_memory("memory_id"),
    "relations": _by_memory("from_id"),
    "consent_queue": _by_memory("memory_id", _conversation("t.conversation_id")),
    "change_log": _by_memory("memory_id", _conversation("t.conversation_id")),
    "events": _by_memory("memory_id", _conversation("t.conversation_id")),
    "conversation_revisions": _conversation("t.conversation_id"),
    "merge_fingerprints": "NULL",
    "store_meta": "NULL",
}
#: Tables with a second unique key, by which a row copied already (a shared row, from another
#: old shard) is recognised: `INSERT OR IGNORE` would check each row against both unique keys,
#: which DuckDB 1.5 does in time that grows with the table (`relations.write_edges`).
CONFLICT_TARGETS: dict[str, str] = {"relations": RELATIONS_EDGE_KEY}
#: Tables copied after the keyed ones, from what the new shard then holds.
DERIVED_TABLES = ("entities", "embedding_cache")

#: How a row is compared before and after: its whole content, except where ids are per store.
DIGEST_SQL: dict[str, str] = {
    "entities": "SELECT DISTINCT md5(canonical_name || '\x1f' || type) FROM {db}.entities",
    "memory_entities": (
        "SELECT DISTINCT md5(me.memory_id || '\x1f' || e.canonical_name || '\x1f' || e.type) "
        "FROM {db}.memory_entities me JOIN {db}.entities e ON e.id = me.entity_id"
    ),
    # When it was written differs per store; the key is what must survive.
    "store_meta": "SELECT DISTINCT md5(key) FROM {db}.store_meta",
}
#: Shared files are ingested by every shard: their copies differ only in when they were written.
WRITE_TIMES: dict[str, str] = {
    "files": "indexed_at",
    "chunks": "updated_at",
    "ingest_errors": "recorded_at",
    "embedding_cache": "created_at",
}


def _key_tables(con: duckdb.DuckDBPyConnection, routes: dict[str, str]) -> None:
    """Temp tables of the attached store `src`: conversation, memory and file route keys."""
    con.register(
        "_routes",
        pa.table(
            {
                "conversation_id": pa.array(list(routes), pa.string()),
                "key": pa.array(list(routes.values()), pa.string()),
            }
        ),
    )
    con.execute("CREATE OR REPLACE TEMP TABLE _conv_keys AS SELECT * FROM _routes")
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _memory_keys AS
        SELECT t.id, coalesce({_conversation("t.conversation_id")},
                              CASE WHEN coalesce(t.user_id, '') <> '' THEN 'user:' || t.user_id
                              END) AS key
        FROM src.memories t
        """
    )
    # A file goes with its conversation; a transcript outside any conversation folder with
    # the one user its lines name; anything else is shared.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _path_keys AS
        WITH file_conversations AS (
            SELECT f.path, coalesce(f.conversation_id, n.conversation_id) AS conversation_id
            FROM src.files f LEFT JOIN src.notes n USING (path)
        ), file_users AS (
            SELECT path, CASE WHEN count(DISTINCT user_id) = 1
                              THEN 'user:' || any_value(user_id) END AS key
            FROM src.memories WHERE kind = 'episode' AND coalesce(user_id, '') <> ''
            GROUP BY path
        )
        SELECT fc.path, coalesce({_conversation("fc.conversation_id")}, fu.key) AS key
        FROM file_conversations fc LEFT JOIN file_users fu USING (path)
        """
    )


def _copy_shard(
    target: duckdb.DuckDBPyConnection, shard: int, shards: int, sources: list[Path], routes: dict
) -> None:
    """Fill the new store of `shard` with the rows of every old store that belong to it."""

    def in_shard(keys: pa.Array) -> pa.Array:
        return pa.array(
            [shard if key is None else shard_of(key, shards) for key in keys.to_pylist()],
            pa.int32(),
        )

    target.create_function(
        "_shard_of",
        in_shard,
        [duckdb.sqltype("VARCHAR")],
        duckdb.sqltype("INTEGER"),
        type="arrow",
        null_handling="special",
    )
    for source in sources:
        target.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        try:
            _key_tables(target, routes)
            for table, key in ROW_KEYS.items():
                rows = f"SELECT t.* FROM src.{table} t WHERE _shard_of({key}) = {shard}"
                if table == "ingest_errors":  # no primary key: keep one of each row
                    target.execute(
                        f"INSERT INTO main.{table} {rows} EXCEPT SELECT * FROM main.{table}"
                    )
                elif table in CONFLICT_TARGETS:
                    target.execute(
                        f"INSERT INTO main.{table} {rows} "
                        f"ON CONFLICT {CONFLICT_TARGETS[table]} DO NOTHING"
                    )
                else:
                    target.execute(f"INSERT OR IGNORE INTO main.{table} {rows}")
            _copy_entities(target)
            first = 1 if shard == 0 else 0
            target.execute(
                "INSERT OR IGNORE INTO main.embedding_cache SELECT c.* FROM src.embedding_cache c "
                "WHERE c.hash IN (SELECT hash FROM main.search_documents) OR (? = 1 AND "
                "c.hash NOT IN (SELECT hash FROM src.search_documents))",
                [first],
            )
        finally:
            target.execute("DETACH src")


def _copy_entities(target: duckdb.DuckDBPyConnection) -> None:
    """The entities the shard's memories name, plus unlinked ones (shared); a name already in
    the shard (from another old shard) keeps its id and the links are pointed at it."""
    target.execute(
        "INSERT OR IGNORE INTO main.entities SELECT e.* FROM src.entities e "
        "WHERE e.id IN (SELECT entity_id FROM main.memory_entities) "
        "OR e.id NOT IN (SELECT entity_id FROM src.memory_entities)"
    )
    target.execute(
        """
        UPDATE main.memory_entities SET entity_id = kept.id
        FROM src.entities copied, main.entities kept
        WHERE main.memory_entities.entity_id = copied.id
          AND kept.canonical_name = copied.canonical_name AND kept.type = copied.type
          AND kept.id <> copied.id
        """
    )


def row_digests(db_paths: list[Path]) -> dict[str, set[str]]:
    """Per table, the set of distinct row digests over these stores (for the lossless check)."""
    digests: dict[str, set[str]] = {table: set() for table in (*ROW_KEYS, *DERIVED_TABLES)}
    con = duckdb.connect()
    try:
        for path in db_paths:
            con.execute(f"ATTACH '{path}' AS db (READ_ONLY)")
            try:
                for table in digests:
                    rows = (
                        f"SELECT * EXCLUDE ({WRITE_TIMES[table]}) FROM db.{table}"
                        if (table in WRITE_TIMES)
                        else f"SELECT * FROM db.{table}"
                    )
                    default = f"SELECT DISTINCT md5(CAST(to_json(t) AS VARCHAR)) FROM ({rows}) t"
                    sql = DIGEST_SQL.get(table, default).format(db="db")
                    digests[table] |= {row[0] for row in con.execute(sql).fetchall()}
            finally:
                con.execute("DETACH db")
    finally:
        con.close()
    return digests


def reshard(settings: Settings, to: int, *, now: datetime | None = None) -> StageReport:
    """Move every row from the current shards into `to` shards; nothing is lost (checked)."""
    report = StageReport("reshard")
    with StageTimer(report):
        current = written_shard_count(settings)  # what is on disk, whatever the env says
        if to < 1:
            raise ValueError(f"--to must be at least 1, not {to}")
        if to == current:
            report.skipped = True
            report.notes.append(f"already {current} shard(s)")
            return report
        old = all_shard_settings(settings, current)
        sources = [Path(s.db_path) for s in old if Path(s.db_path).exists()]
        for shard in old:  # queued reads count before their rows move
            if Path(shard.db_path).exists():
                apply_access_log(shard)
                with open_store(shard.db_path):
                    pass  # migrated to the current schema, so the tables line up
        routes = read_routes(settings)

        stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
        base = Path(settings.db_path).parent
        staging = base / f"reshard-{stamp}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staged_base = settings.model_copy(
            update={
                "db_path": staging / Path(settings.db_path).name,
                "index_dir": staging / "index",
            }
        )
        new = all_shard_settings(staged_base, to)
        for shard, shard_settings_ in enumerate(new):
            with open_store(shard_settings_.db_path) as target:
                _copy_shard(target, shard, to, sources, routes)

        before, after = row_digests(sources), row_digests([Path(s.db_path) for s in new])
        lost = {t: len(before[t] - after[t]) for t in before if before[t] - after[t]}
        made_up = {t: len(after[t] - before[t]) for t in after if after[t] - before[t]}
        if lost or made_up:
            raise RuntimeError(
                f"re-shard check failed (old stores untouched, staging kept at {staging}): "
                f"rows missing {lost}, rows not in the old stores {made_up}"
            )
        backup = base / f"reshard-{stamp}.previous"
        _swap(settings, current, to, staging, backup)
        if to > 1:
            write_layout(settings, to)
            write_routes(settings, routes)
        report.counts = {
            "from": current,
            "to": to,
            **{f"rows_{table}": len(rows) for table, rows in after.items() if rows},
        }
        report.notes.append(f"the previous stores are in {backup}")
    # Indexes and workspaces of the new shards (imported here: both pull in heavier modules).
    from memory_dag.index.build import build_indexes
    from memory_dag.ingest.routing import route_workspace

    route_workspace(settings, to)
    for shard_settings_ in all_shard_settings(settings, to):
        list(build_indexes(shard_settings_, force=True))
    return report


def _store_files(settings: Settings, shards: int) -> list[Path]:
    """What the stores of a layout are on disk (the single store's files, or the shard folder)."""
    if shards > 1:
        return [shards_root(settings)]
    db_path = Path(settings.db_path)
    return [
        db_path,
        db_path.with_name(db_path.name + ".wal"),
        Path(settings.index_dir),
        access_log_dir(settings),
    ]


def _swap(settings: Settings, current: int, to: int, staging: Path, backup: Path) -> None:
    """Old stores → backup, staged stores → their places (each a rename on one filesystem)."""
    backup.mkdir(parents=True)
    base = Path(settings.db_path).parent
    for path in _store_files(settings, current):
        if path.exists():
            path.rename(backup / path.relative_to(base))
    staged_base = settings.model_copy(
        update={"db_path": staging / Path(settings.db_path).name, "index_dir": staging / "index"}
    )
    for staged, final in zip(
        _store_files(staged_base, to), _store_files(settings, to), strict=True
    ):
        if staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            staged.rename(final)
    shutil.rmtree(staging, ignore_errors=True)
