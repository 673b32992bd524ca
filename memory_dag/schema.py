"""The DuckDB schema of a memory store, as an ordered list of forward migrations.

Column names are a public interface (people query them with SQL): add columns in a new
migration, never rename or drop them in place. `docs/tables.md` documents every table.
"""

from __future__ import annotations

#: Each entry migrates the schema from version i to i + 1. Never edit a released entry.
MIGRATIONS: list[str] = [
    # 0 → 1: the foundation: files, notes, memories (episodes), chunks, embeddings, errors.
    """
    CREATE TABLE IF NOT EXISTS store_meta (
        key        TEXT PRIMARY KEY,
        value      TEXT NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );

    CREATE TABLE IF NOT EXISTS files (
        path            TEXT PRIMARY KEY,   -- relative to the workspace, posix
        source          TEXT NOT NULL,      -- memory | sessions
        kind            TEXT NOT NULL,      -- note | entry | transcript
        hash            TEXT NOT NULL,      -- sha256 of the bytes
        mtime           DOUBLE NOT NULL,
        size            BIGINT NOT NULL,
        conversation_id TEXT,
        session_id      TEXT,
        indexed_at      TIMESTAMPTZ NOT NULL,
        chunked_hash    TEXT                -- the hash the current chunks were made from
    );

    CREATE TABLE IF NOT EXISTS notes (
        path            TEXT PRIMARY KEY,
        kind            TEXT NOT NULL,      -- note | entry
        body            TEXT NOT NULL,
        body_start_line INTEGER NOT NULL,
        entry_id        TEXT,               -- front matter `id`
        role            TEXT,               -- front matter `role`
        conversation_id TEXT,
        created_at      TIMESTAMPTZ,
        summary_kind    TEXT,
        replaced_by     TEXT,
        front_matter    JSON
    );

    CREATE TABLE IF NOT EXISTS memories (
        id              TEXT PRIMARY KEY,
        kind            TEXT NOT NULL,      -- episode | fact | summary | reflection | insight | procedural
        content         TEXT NOT NULL,
        conversation_id TEXT,
        session_id      TEXT,
        user_id         TEXT,
        agent_id        TEXT,
        source_role     TEXT,               -- user | assistant (episodes), writer for others
        speaker         TEXT,
        turn_id         TEXT,               -- the turn id as given in the transcript
        path            TEXT,               -- source file, when the memory came from one
        line            INTEGER,
        event_time      TIMESTAMPTZ,        -- when it happened
        created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
        valid_until     TIMESTAMPTZ,        -- NULL = active; set = soft-deleted
        state           TEXT NOT NULL DEFAULT 'active',   -- active | soft_deleted
        purge_at        TIMESTAMPTZ,
        confidence      DOUBLE NOT NULL DEFAULT 1.0,
        importance      INTEGER NOT NULL DEFAULT 2,       -- 1..5
        pinned          BOOLEAN NOT NULL DEFAULT false,
        category        TEXT,
        access_count    BIGINT NOT NULL DEFAULT 0,
        last_accessed   TIMESTAMPTZ,
        decay_rate      DOUBLE NOT NULL DEFAULT 0.1,
        source_ids      TEXT[] NOT NULL DEFAULT [],
        tags            TEXT[] NOT NULL DEFAULT [],
        attributes      JSON,
        replaced_by     TEXT,
        supersedes      TEXT
    );

    CREATE TABLE IF NOT EXISTS chunks (
        id              TEXT PRIMARY KEY,
        path            TEXT NOT NULL,
        source          TEXT NOT NULL,      -- memory | sessions
        kind            TEXT NOT NULL,      -- note | entry | transcript
        start_line      INTEGER NOT NULL,
        end_line        INTEGER NOT NULL,
        hash            TEXT NOT NULL,      -- sha256 of `search_text`: the embedding cache key
        text            TEXT NOT NULL,      -- what was written or said, as shown in results
        search_text     TEXT NOT NULL,      -- what is embedded and BM25-indexed (search_text.py)
        speaker         TEXT,               -- who said it (transcript turns)
        tokens          INTEGER NOT NULL,
        turn_ids        TEXT[] NOT NULL DEFAULT [],
        conversation_id TEXT,
        session_id      TEXT,
        event_time      TIMESTAMPTZ,
        updated_at      TIMESTAMPTZ NOT NULL
    );

    CREATE TABLE IF NOT EXISTS embedding_cache (
        provider   TEXT NOT NULL,
        model      TEXT NOT NULL,
        hash       TEXT NOT NULL,
        dims       INTEGER NOT NULL,
        embedding  FLOAT[] NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (provider, model, hash)
    );

    CREATE TABLE IF NOT EXISTS ingest_errors (
        path        TEXT NOT NULL,
        line        INTEGER,
        reason      TEXT NOT NULL,
        file_hash   TEXT,
        recorded_at TIMESTAMPTZ NOT NULL
    );

    CREATE OR REPLACE VIEW episodes AS
        SELECT id, turn_id, session_id, conversation_id, source_role AS role, speaker, content,
               event_time, line, path
        FROM memories WHERE kind = 'episode';

    CREATE OR REPLACE VIEW active_memories AS
        SELECT * FROM memories WHERE valid_until IS NULL AND state = 'active';

    CREATE OR REPLACE VIEW conversations AS
        SELECT conversation_id,
               count(DISTINCT session_id) AS sessions,
               count(*) AS turns,
               min(event_time) AS first_turn_at,
               max(event_time) AS last_turn_at
        FROM memories WHERE kind = 'episode'
        GROUP BY conversation_id;

    CREATE OR REPLACE VIEW file_status AS
        SELECT f.path, f.source, f.kind, f.size, f.indexed_at,
               (SELECT count(*) FROM chunks c WHERE c.path = f.path) AS chunks,
               (SELECT count(*) FROM ingest_errors e
                 WHERE e.path = f.path AND e.file_hash = f.hash) AS errors
        FROM files f;
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)

#: Tables whose rows belong to one workspace file (deleted with it).
FILE_OWNED_TABLES = ("notes", "chunks", "ingest_errors")
