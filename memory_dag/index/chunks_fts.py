"""DuckDB's FTS index on `chunks` (`fts_main_chunks.match_bm25` in SQL), rebuilt whole or
brought up to date in place.

`PRAGMA create_fts_index` can only rebuild (DuckDB 1.5's fts extension has no incremental
mode): ~40 s at 1M chunks, also when one new session added 20. The index is plain tables in
the schema `fts_main_chunks` that `match_bm25` reads: `docs` (docid, name, len), `terms`
(docid, fieldid, termid: one row per kept word), `dict` (termid, term, df) and `stats`
(num_docs, avgdl). A score depends on a document's terms and length, each term's df,
num_docs and avgdl, never on the ids. So a small change (`SMALL_CHANGE`) is applied to those
tables as the pragma's own script computes them (fts extension 1.5, `fts_indexing.cpp`): the
same `tokenize` macro, stopwords (tested on the word before stemming) and Porter stemmer; the
rows of chunks that went or changed are deleted, those of new chunks added under new ids, and
the df of every term either touched and the stats are computed again, in one transaction.
`fts_main_chunks.indexed` (id, hash of every indexed chunk) says what the index holds; a
rebuild makes it, so an index without it (or a large change) is rebuilt. Scores equal a
rebuild's exactly (`tests/index/test_chunks_fts.py`).
"""

from __future__ import annotations

import duckdb

SCHEMA = "fts_main_chunks"
#: At most this share of the indexed chunks may differ for an update in place.
SMALL_CHANGE = 0.05

_REBUILD = (
    "PRAGMA create_fts_index('chunks', 'id', 'text', stemmer = 'porter', "
    "stopwords = 'english', overwrite = 1)"
)


def refresh_chunks_fts(con: duckdb.DuckDBPyConnection) -> str:
    """Bring the FTS index in line with `chunks`: in place for a small change, else rebuilt.
    Returns how ("rebuilt", or "updated in place: N added, M removed")."""
    change = None
    if _recorded(con):
        con.execute("BEGIN TRANSACTION")
        try:
            change = _staged_change(con)
            if change is not None:
                _update_in_place(con)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            _drop_scratch(con)
    if change is None:
        rebuild_chunks_fts(con)
        return "rebuilt"
    added, removed = change
    return f"updated in place: {added} added, {removed} removed"


def rebuild_chunks_fts(con: duckdb.DuckDBPyConnection) -> None:
    """The extension's own build, then the record of what it indexed."""
    con.execute(_REBUILD)
    con.execute(f"CREATE TABLE {SCHEMA}.indexed AS SELECT id, hash FROM chunks")


def _recorded(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the index has the tables an update in place reads, its record among them."""
    tables = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name IN ('indexed', 'docs', 'terms', 'dict', 'stats')",
        [SCHEMA],
    ).fetchone()[0]
    return tables == 5


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
        # The pragma's terms: tokenize, drop empty words and stopwords, then stem.
        f"CREATE TEMP TABLE _fts_new_terms AS WITH tokenized AS ("
        f"SELECT unnest({s}.tokenize(text)) AS w, docid FROM _fts_new_docs) "
        "SELECT stem(w, 'porter') AS term, docid FROM tokenized "
        f"WHERE w NOT NULL AND len(w) > 0 AND w NOT IN (SELECT sw FROM {s}.stopwords)",
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
