"""DuckDB's FTS index, filled whole or brought up to date in place by `chunks_fts`, scores
every chunk as the extension's own build (`PRAGMA create_fts_index`) does."""

from __future__ import annotations

import random
from collections.abc import Iterator

import duckdb
import pytest

from memory_dag.config import Settings
from memory_dag.index.chunks_fts import (
    SCHEMA,
    make_empty_index,
    rebuild_chunks_fts,
    refresh_chunks_fts,
)
from memory_dag.store.connection import load_fts, open_store

WORDS = [
    "cat",
    "cats",
    "running",
    "runner",
    "ran",
    "the",
    "a",
    "and",
    "of",
    "is",
    "it's",
    "Miso",
    "Paris",
    "café",
    "naïve",
    "résumé",
    "2024",
    "x1",
    "hello-world",
    "e-mail",
    "pottery",
    "hiking",
    "adoption",
    "adopted",
    "support",
    "group",
    "yesterday",
    "powerful",
    "lake",
    "camping",
    "painting",
    "sunrise",
    "can't",
    "won't",
    "über",
]
QUERIES = ["cats running", "Miso", "café résumé", "adopted adoption", "the a of", "sunrise", "zzz"]


def _text(rng: random.Random) -> str | None:
    roll = rng.random()
    if roll < 0.03:
        return None
    if roll < 0.06:
        return ""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + rng.choice(".!?,")


def _chunks(con: duckdb.DuckDBPyConnection, rows: dict[str, str | None]) -> None:
    con.execute("DELETE FROM chunks")
    con.executemany(
        "INSERT INTO chunks VALUES (?, md5(coalesce(?, '<null>')), ?)",
        [(key, text, text) for key, text in rows.items()],
    )


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    load_fts(con)
    con.execute("CREATE TABLE chunks (id TEXT PRIMARY KEY, hash TEXT, text TEXT)")
    yield con
    con.close()


def _index(con: duckdb.DuckDBPyConnection) -> dict[str, object]:
    """What `match_bm25` reads, without the ids (which differ), and every chunk's scores."""
    return {
        "stats": con.execute(f"SELECT num_docs, avgdl FROM {SCHEMA}.stats").fetchall(),
        "docs": sorted(con.execute(f"SELECT name, len FROM {SCHEMA}.docs").fetchall()),
        "dict": sorted(con.execute(f"SELECT term, df FROM {SCHEMA}.dict").fetchall()),
        "postings": sorted(
            con.execute(
                f"SELECT d.name, w.term, count(*) FROM {SCHEMA}.terms t "
                f"JOIN {SCHEMA}.docs d USING (docid) JOIN {SCHEMA}.dict w USING (termid) "
                "GROUP BY ALL"
            ).fetchall()
        ),
        "scores": {
            query: con.execute(
                f"SELECT id, {SCHEMA}.match_bm25(id, ?) AS s FROM chunks ORDER BY id", [query]
            ).fetchall()
            for query in QUERIES
        },
    }


def test_small_changes_in_place_score_as_a_rebuild_does(con: duckdb.DuckDBPyConnection) -> None:
    rng = random.Random(15)
    rows = {f"ch_{number:04}": _text(rng) for number in range(500)}
    rows["ch_only"] = "Zanzibar"  # the one chunk with its word: gone in the first round
    _chunks(con, rows)
    assert refresh_chunks_fts(con) == "rebuilt by the extension"  # no index yet

    for _ in range(4):  # several increments in a row, each compared with a rebuild
        rows.pop("ch_only", None)
        for key in rng.sample(sorted(rows), 6):  # gone
            del rows[key]
        for key in rng.sample(sorted(rows), 3):  # same id, new text
            rows[key] = f"{_text(rng) or ''} lake"
        for _ in range(8):  # new, one with a word no chunk held
            rows[f"ch_{rng.randrange(10**6):07}"] = f"{_text(rng) or ''} kayaking"
        _chunks(con, rows)
        done = refresh_chunks_fts(con)
        assert done.startswith("updated in place")
        in_place = _index(con)

        rebuild_chunks_fts(con)
        assert in_place == _index(con)
        assert any(score for _, score in in_place["scores"]["cats running"])


def test_an_index_made_empty_is_filled_whole_as_the_extension_builds_it(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """A new store: the extension makes the index while `chunks` is empty; the first fill and
    every large change after it are this module's SQL, and score as the pragma does."""
    assert make_empty_index(con)
    assert not make_empty_index(con)  # made already
    rng = random.Random(11)
    rows = {f"ch_{number:03}": _text(rng) for number in range(300)}
    rows["ch_alone"] = "Zanzibar"
    for _ in range(3):  # the first fill, then two changes too large for in place
        _chunks(con, rows)
        assert refresh_chunks_fts(con) == "rebuilt"
        filled = _index(con)
        assert con.execute(f"SELECT count(*) FROM {SCHEMA}.indexed").fetchone()[0] == len(rows)

        rebuild_chunks_fts(con)
        assert filled == _index(con)
        assert any(score for _, score in filled["scores"]["cats running"])
        rows = {key: text for key, text in rows.items() if rng.random() < 0.7}
        rows.update({f"new_{rng.randrange(10**6):07}": _text(rng) for _ in range(60)})


def test_no_empty_index_over_chunks_that_exist(con: duckdb.DuckDBPyConnection) -> None:
    _chunks(con, {"ch_1": "pottery"})
    assert not make_empty_index(con)
    assert con.execute(
        "SELECT count(*) FROM duckdb_schemas() WHERE schema_name = ?", [SCHEMA]
    ).fetchone() == (0,)


def test_a_large_change_or_an_index_without_its_record_is_rebuilt(
    con: duckdb.DuckDBPyConnection,
) -> None:
    rng = random.Random(7)
    rows = {f"ch_{number:03}": _text(rng) for number in range(100)}
    _chunks(con, rows)
    con.execute(
        "PRAGMA create_fts_index('chunks', 'id', 'text', stemmer = 'porter', "
        "stopwords = 'english', overwrite = 1)"
    )  # as memory-dag built it before it kept `indexed`
    built = _index(con)
    assert refresh_chunks_fts(con) == "rebuilt"  # filled again whole, the extension's macros kept
    assert _index(con) == built
    assert refresh_chunks_fts(con) == "updated in place: 0 added, 0 removed"

    _chunks(con, {**rows, **{f"new_{n}": "fresh words" for n in range(20)}})  # 20% new
    assert refresh_chunks_fts(con) == "rebuilt"
    assert con.execute(f"SELECT count(*) FROM {SCHEMA}.indexed").fetchone()[0] == 120


def test_a_new_session_reaches_sql_full_text_search_in_place(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the pipeline: the index step updates DuckDB's FTS index in place (the test
    store is small: every change is a large share, so the threshold is lifted), SQL finds the
    new session's words, and the scores are a forced rebuild's."""
    from memory_dag.index import chunks_fts
    from memory_dag.pipeline import run_all
    from tests.index.test_incremental import new_session

    monkeypatch.setattr(chunks_fts, "SMALL_CHANGE", 1.0)
    first = {report.stage: report for report in run_all(settings)}
    # The chunks stage of the new store made the index empty; the index step filled it.
    assert first["chunks_fts"].notes[0].startswith("rebuilt;")
    new_session(settings)
    reports = {report.stage: report for report in run_all(settings)}

    assert reports["chunks_fts"].notes[0].startswith("updated in place: 2 added, 0 removed")
    query = "SELECT id, fts_main_chunks.match_bm25(id, 'zebra finch') AS s FROM chunks ORDER BY id"
    with open_store(settings.db_path) as con:
        load_fts(con)
        in_place = con.execute(query).fetchall()
        rebuild_chunks_fts(con)
        assert con.execute(query).fetchall() == in_place
    assert [score for _, score in in_place if score is not None] != []
