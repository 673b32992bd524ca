"""DuckDB's FTS index on `chunks` (`fts_main_chunks.match_bm25` in SQL), filled by this
module's SQL, whole or in place.

The index is plain tables in the schema `fts_main_chunks` that `match_bm25` reads: `docs`
(docid, name, len), `terms` (docid, fieldid, termid: one row per kept word), `dict` (termid,
term, df) and `stats` (num_docs, avgdl), beside the extension's `tokenize` and `match_bm25`
macros, `stopwords` and `fields`. A score depends on a document's terms and length, each
term's df, num_docs and avgdl, never on the ids.

`PRAGMA create_fts_index` (DuckDB 1.5) can only build the whole index, and it stems every word
it keeps, each occurrence anew (100k chunks: 5.7 s, 10.2 CPU s; 1M: ~50 s; as long when one
new session added 20: `benchmarks/fts_build.py`). So the extension makes the index once, while
`chunks` is still empty (`make_empty_index`, called by the chunks stage of a new store): its
schema, macros and stopwords. This module then fills the tables as the pragma's own script
computes them (fts extension 1.5, `fts_indexing.cpp`): the same `tokenize` macro, stopwords
(tested on the word before stemming) and Porter stemmer, each distinct word stemmed once
(100k: 3.4 s, 5.6 CPU s). After a small change (`SMALL_CHANGE`) the rows of chunks that went
or changed are deleted, those of new chunks added under new ids, and the df of every term
either touched and the stats computed again; after a larger one the tables are made again
whole. Each in one transaction. `fts_main_chunks.indexed` (id, hash of every indexed chunk)
says what the index holds. A store with no FTS schema (made before this) is built by the
pragma once. Scores equal the pragma's exactly (`tests/index/test_chunks_fts.py`).
"""

from __future__ import annotations

import duckdb

from memory_dag.store.connection import load_fts

SCHEMA = "fts_main_chunks"
#: At most this share of the indexed chunks may differ for an update in place.
SMALL_CHANGE = 0.05

_REBUILD = (
    "PRAGMA create_fts_index('chunks', 'id', 'text', stemmer = 'porter', "
    "stopwords = 'english', overwrite = 1)"
)
#: What the pragma makes and `match_bm25` reads.
_INDEX_TABLES = ("docs", "terms", "dict", "stats", "fields", "stopwords")
_INDEX_MACROS = ("tokenize", "match_bm25")


def make_empty_index(con: duckdb.DuckDBPyConnection) -> bool:
    """While `chunks` is empty and has no FTS index, let the extension make one (its schema,
    macros and stopwords, in milliseconds on no rows) for this module to fill. True if it did.

    An extension that does not load is left for the index step, which reports why."""
    chunks = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
    if chunks or _index_tables(con) is not None:
        return False
    try:
        load_fts(con)
    except (RuntimeError, duckdb.Error):
        return False
    con.execute(_REBUILD)
    con.execute(f"CREATE TABLE {SCHEMA}.indexed (id TEXT, hash TEXT)")
    return True


def refresh_chunks_fts(con: duckdb.DuckDBPyConnection) -> str:
    """Bring the FTS index in line with `chunks`: in place for a small change, else made
    again whole. Returns how ("rebuilt", or "updated in place: N added, M removed")."""
    tables = _index_tables(con)
    if tables is None:  # a store from before `make_empty_index`
        rebuild_chunks_fts(con)
        return "rebuilt by the extension"
    con.execute("BEGIN TRANSACTION")
    try:
        # Only an index with its record (`indexed`) can say what changed.
        change = _staged_change(con) if "indexed" in tables else None
        if change is None:
            _fill_whole(con)
        else:
            _update_in_place(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        _drop_scratch(con)
    if change is None:
        return "rebuilt"
    added, removed = change
    return f"updated in place: {added} added, {removed} removed"


def rebuild_chunks_fts(con: duckdb.DuckDBPyConnection) -> None:
    """The extension's own build, then the record of what it indexed: a forced rebuild makes
    everything again, macros included."""
    con.execute(_REBUILD)
    con.execute(f"CREATE TABLE {SCHEMA}.indexed AS SELECT id, hash FROM chunks")


def _names(con: duckdb.DuckDBPyConnection, catalog: str, column: str) -> set[str]:
    rows = con.execute(
        f"SELECT {column} FROM {catalog}() WHERE database_name = current_database() "
        "AND schema_name = ?",
        [SCHEMA],
    ).fetchall()
    return {name for (name,) in rows}


def _index_tables(con: duckdb.DuckDBPyConnection) -> set[str] | None:
    """The index schema's tables, when the extension made it (its tables and macros are
    there); else None."""
    tables = _names(con, "duckdb_tables", "table_name")
    if not set(_INDEX_TABLES) <= tables:
        return None
    if not set(_INDEX_MACROS) <= _names(con, "duckdb_functions", "function_name"):
        return None
    return tables


def _staged_change(con: duckdb.DuckDBPyConnection) -> tuple[int, int] | None:
    """What went (or changed) and what came, by id and hash, as the scratch tables `_fts_gone`
    and `_fts_new`; (added, removed), or None when the change is too large for in place."""
    s = SCHEMA
    con.execute(
        f"CREATE TEMP TABLE _fts_gone AS SELECT i.id, i.hash FROM {s}.indexed i "
        "ANTI JOIN chunks c ON c.id = i.id AND c.hash = i.hash"
    )
    con.execute(
        f"CREATE TEMP TABLE _fts_new AS SELECT c.id, c.hash FROM chunks c "
        f"ANTI JOIN {s}.indexed i ON c.id = i.id AND c.hash = i.hash"
    )
    indexed, added, removed = con.execute(
        f"SELECT (SELECT count(*) FROM {s}.indexed), (SELECT count(*) FROM _fts_new), "
        "(SELECT count(*) FROM _fts_gone)"
    ).fetchone()
    if not indexed or added + removed > SMALL_CHANGE * indexed:
        return None
    return int(added), int(removed)


_SCRATCH = ("_fts_gone", "_fts_new", "_fts_gone_docs", "_fts_new_docs", "_fts_new_terms", "_fts_df")


def _terms_of(documents: str) -> str:
    """The pragma's terms (term, docid) of `documents` (docid, text): tokenize, drop empty
    words and stopwords, then stem. Each distinct word is tested and stemmed once, not each
    occurrence: stemming every kept word was half of the pragma's time."""
    s = SCHEMA
    return (
        f"WITH words AS MATERIALIZED (SELECT unnest({s}.tokenize(text)) AS w, docid "
        f"FROM {documents}), "
        "stems AS (SELECT w, stem(w, 'porter') AS term FROM (SELECT DISTINCT w FROM words) "
        f"WHERE len(w) > 0 AND w NOT IN (SELECT sw FROM {s}.stopwords)) "
        "SELECT stems.term, words.docid FROM words JOIN stems USING (w)"
    )


def _fill_whole(con: duckdb.DuckDBPyConnection) -> None:
    """Make the index's tables again from every chunk, as the pragma would (a document's id is
    its chunk's row id); the extension's macros, stopwords and fields stay."""
    s = SCHEMA
    statements = [
        f"CREATE TEMP TABLE _fts_new_terms AS "
        f"{_terms_of('(SELECT rowid AS docid, text FROM chunks)')}",
        f"CREATE OR REPLACE TABLE {s}.dict AS SELECT "
        "row_number() OVER (ORDER BY term) - 1 AS termid, term, df FROM ("
        "SELECT term, count(DISTINCT docid) AS df FROM _fts_new_terms GROUP BY term)",
        f"CREATE OR REPLACE TABLE {s}.terms AS SELECT t.docid, 0::BIGINT AS fieldid, "
        f"d.termid FROM _fts_new_terms t JOIN {s}.dict d USING (term)",
        f"CREATE OR REPLACE TABLE {s}.docs AS SELECT c.rowid AS docid, c.id AS name, "
        "coalesce(n.len, 0) AS len FROM chunks c LEFT JOIN ("
        "SELECT docid, count(*) AS len FROM _fts_new_terms GROUP BY docid) n "
        "ON n.docid = c.rowid",
        f"CREATE OR REPLACE TABLE {s}.stats AS SELECT count(docid) AS num_docs, "
        f"sum(len) / count(len) AS avgdl FROM {s}.docs",
        f"CREATE OR REPLACE TABLE {s}.indexed AS SELECT id, hash FROM chunks",
    ]
    for statement in statements:
        con.execute(statement)


def _update_in_place(con: duckdb.DuckDBPyConnection) -> None:
    """Apply the staged change (`_staged_change`) to the index's tables."""
    s = SCHEMA
    statements = [
        # The documents that go, and the terms they held.
        f"CREATE TEMP TABLE _fts_gone_docs AS SELECT docid FROM {s}.docs "
        "WHERE name IN (SELECT id FROM _fts_gone)",
        # The documents that come, under ids after the largest in use.
        f"CREATE TEMP TABLE _fts_new_docs AS SELECT "
        f"(SELECT coalesce(max(docid), -1) FROM {s}.docs) + row_number() OVER (ORDER BY c.id) "
        "AS docid, c.id AS name, c.text FROM chunks c "
        "SEMI JOIN _fts_new n ON c.id = n.id AND c.hash = n.hash",
        f"CREATE TEMP TABLE _fts_new_terms AS {_terms_of('_fts_new_docs')}",
        # Terms whose df can change: those of the documents that go and those that come.
        f"CREATE TEMP TABLE _fts_df AS SELECT DISTINCT termid FROM {s}.terms "
        "WHERE docid IN (SELECT docid FROM _fts_gone_docs)",
        f"DELETE FROM {s}.terms WHERE docid IN (SELECT docid FROM _fts_gone_docs)",
        f"DELETE FROM {s}.docs WHERE docid IN (SELECT docid FROM _fts_gone_docs)",
        f"INSERT INTO {s}.dict (termid, term, df) SELECT "
        f"(SELECT coalesce(max(termid), -1) FROM {s}.dict) + row_number() OVER (ORDER BY term), "
        f"term, 0 FROM (SELECT DISTINCT term FROM _fts_new_terms "
        f"WHERE term NOT IN (SELECT term FROM {s}.dict))",
        f"INSERT INTO {s}.terms (docid, fieldid, termid) "
        f"SELECT t.docid, 0, d.termid FROM _fts_new_terms t JOIN {s}.dict d USING (term)",
        f"INSERT INTO {s}.docs (docid, name, len) SELECT n.docid, n.name, count(t.term) "
        "FROM _fts_new_docs n LEFT JOIN _fts_new_terms t USING (docid) "
        "GROUP BY n.docid, n.name",
        f"INSERT INTO _fts_df SELECT termid FROM {s}.dict "
        "WHERE term IN (SELECT term FROM _fts_new_terms)",
        f"UPDATE {s}.dict AS d SET df = counted.df FROM ("
        f"SELECT k.termid, count(DISTINCT t.docid) AS df FROM (SELECT DISTINCT termid FROM "
        f"_fts_df) k LEFT JOIN {s}.terms t USING (termid) GROUP BY k.termid) AS counted "
        "WHERE d.termid = counted.termid",
        f"DELETE FROM {s}.dict WHERE df = 0",  # a term no document holds any more
        # The pragma's stats, over every document.
        f"UPDATE {s}.stats SET num_docs = (SELECT count(docid) FROM {s}.docs), "
        f"avgdl = (SELECT sum(len) / count(len) FROM {s}.docs)",
        f"DELETE FROM {s}.indexed WHERE id IN (SELECT id FROM _fts_gone)",
        f"INSERT INTO {s}.indexed SELECT id, hash FROM _fts_new",
    ]
    for statement in statements:
        con.execute(statement)


def _drop_scratch(con: duckdb.DuckDBPyConnection) -> None:
    for table in _SCRATCH:
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")
