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
        -- kind: episode | fact | summary | reflection | insight | procedural
        kind            TEXT NOT NULL,
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
        role            TEXT,               -- user | assistant (transcript turns)
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
    # 1 → 2: durable memories: entities, relations, history, revisions, sessions, events.
    """
    CREATE TABLE IF NOT EXISTS entities (
        id             TEXT PRIMARY KEY,    -- ent_*
        canonical_name TEXT NOT NULL,
        type           TEXT NOT NULL,       -- person | project | organization | location | ...
        aliases        TEXT[] NOT NULL DEFAULT [],
        summary        TEXT,
        mention_count  BIGINT NOT NULL DEFAULT 1,
        protected      BOOLEAN NOT NULL DEFAULT false,
        created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (canonical_name, type)
    );

    CREATE TABLE IF NOT EXISTS memory_entities (
        memory_id  TEXT NOT NULL,
        entity_id  TEXT NOT NULL,
        mention    TEXT,                    -- the text as written
        provider   TEXT,                    -- regex | heuristic | spacy | llm
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (memory_id, entity_id)
    );

    CREATE TABLE IF NOT EXISTS relations (
        id            TEXT PRIMARY KEY,
        from_id       TEXT NOT NULL,
        to_id         TEXT NOT NULL,
        relation_type TEXT NOT NULL DEFAULT 'related_to',
        strength      DOUBLE NOT NULL,
        created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (from_id, to_id, relation_type)
    );

    -- Every write: ADD, UPDATE, DELETE, MERGE, LINK, TTL, DECAY, PURGE, RESTORE, ...
    CREATE TABLE IF NOT EXISTS history (
        id        TEXT PRIMARY KEY,
        memory_id TEXT,
        event     TEXT NOT NULL,
        old_ref   TEXT,
        new_ref   TEXT,
        actor     TEXT,
        meta      JSON,
        ts        TIMESTAMPTZ NOT NULL DEFAULT now()
    );

    -- Seed 003 §1: per-conversation revision and the change log behind the delta header.
    CREATE TABLE IF NOT EXISTS conversation_revisions (
        conversation_id TEXT PRIMARY KEY,   -- '' for memories without a conversation
        rev             BIGINT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS change_log (
        id              TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        rev             BIGINT NOT NULL,
        memory_id       TEXT,
        -- event: created | updated | merged | deleted | soft_deleted | restored
        event           TEXT NOT NULL,
        meta            JSON,
        ts              TIMESTAMPTZ NOT NULL DEFAULT now()
    );

    -- Seed 004: a session is registered when first seen and consolidated once.
    CREATE TABLE IF NOT EXISTS sessions_consolidations (
        -- the transcript file: session ids repeat across conversations
        path            TEXT PRIMARY KEY,
        session_id      TEXT NOT NULL,
        conversation_id TEXT,
        first_seen_at   TIMESTAMPTZ NOT NULL,
        consolidated_at TIMESTAMPTZ,        -- NULL = pending
        facts_written   INTEGER,
        method          TEXT                -- llm | rules
    );

    -- Seed 003 §14: operational events (LLM failures, skips, job runs) for "what happened".
    CREATE TABLE IF NOT EXISTS events (
        id              TEXT PRIMARY KEY,
        conversation_id TEXT,
        node            TEXT NOT NULL,      -- facts | reconcile | summaries | maintenance | ...
        op              TEXT NOT NULL,
        status          TEXT NOT NULL,      -- ok | error | skipped
        memory_id       TEXT,
        detail          TEXT,
        meta            JSON,
        ts              TIMESTAMPTZ NOT NULL DEFAULT now()
    );

    -- Seed 003 §4: pairs already judged by the merge worker, not re-checked for 14 days.
    CREATE TABLE IF NOT EXISTS merge_fingerprints (
        fingerprint TEXT PRIMARY KEY,
        verdict     TEXT NOT NULL,
        checked_at  TIMESTAMPTZ NOT NULL
    );

    -- Summaries are memories of kind 'summary'; this view shows their tree metadata as columns.
    CREATE OR REPLACE VIEW summaries AS
        SELECT id, conversation_id, content, created_at, valid_until, state,
               CAST(json_extract(attributes, '$.level') AS INTEGER) AS level,
               CAST(json_extract(attributes, '$.chunk_index') AS INTEGER) AS chunk_index,
               CAST(json_extract(attributes, '$.group_index') AS INTEGER) AS group_index,
               CAST(json_extract(attributes, '$.parent_group') AS INTEGER) AS parent_group,
               CAST(json_extract(attributes, '$.is_final') AS BOOLEAN) AS is_final,
               json_extract_string(attributes, '$.summary_level') AS summary_level,
               CAST(json_extract(attributes, '$.input_tokens') AS INTEGER) AS input_tokens,
               CAST(json_extract(attributes, '$.output_tokens') AS INTEGER) AS output_tokens,
               CAST(json_extract(attributes, '$.compression_ratio') AS DOUBLE) AS compression_ratio,
               json_extract_string(attributes, '$.method') AS method
        FROM memories WHERE kind = 'summary';

    -- Everything the search index holds: chunks of notes and transcripts, plus active derived
    -- memories (facts, summaries, reflections, ...). `hash` keys the embedding cache.
    CREATE OR REPLACE VIEW search_documents AS
        SELECT id, kind, source, path, start_line, end_line, text, search_text, speaker,
               turn_ids, conversation_id, session_id, event_time, hash,
               role, NULL::TEXT AS category, NULL::TEXT AS user_id, NULL::TEXT AS agent_id,
               NULL::INTEGER AS importance, false AS pinned, updated_at
        FROM chunks
        UNION ALL
        SELECT id, kind, 'memories' AS source, coalesce(path, '') AS path,
               coalesce(line, 0) AS start_line, coalesce(line, 0) AS end_line,
               content AS text, content AS search_text, speaker,
               []::TEXT[] AS turn_ids, conversation_id, session_id,
               coalesce(event_time, created_at) AS event_time, sha256(content) AS hash,
               source_role AS role, category, user_id, agent_id, importance, pinned,
               created_at AS updated_at
        FROM memories
        WHERE kind IN ('fact', 'summary', 'reflection', 'insight', 'procedural')
          AND valid_until IS NULL AND state = 'active';

    CREATE OR REPLACE VIEW facts AS
        SELECT * FROM memories WHERE kind = 'fact' AND valid_until IS NULL AND state = 'active';
    """,
    # 2 → 3: the consent queue (seed 003 §10); episodes show the user a transcript line names.
    """
    -- A proposed change to a user-context field (preferred name, pronouns, city, language,
    -- tone, ...): applied only on consent (sensitive) or when corroborated (benign).
    CREATE TABLE IF NOT EXISTS consent_queue (
        id              TEXT PRIMARY KEY,   -- cns_*
        memory_id       TEXT NOT NULL,      -- the fact the change replaces or removes
        field           TEXT NOT NULL,      -- preferred_name | pronouns | city | language | ...
        sensitivity     TEXT NOT NULL,      -- sensitive | benign
        action          TEXT NOT NULL,      -- replace | remove
        current_text    TEXT NOT NULL,
        proposed_text   TEXT,               -- NULL for remove
        user_id         TEXT,
        conversation_id TEXT,
        session_id      TEXT,
        speaker         TEXT,
        source_role     TEXT,
        category        TEXT,
        importance      INTEGER,
        event_time      TIMESTAMPTZ,
        source_ids      TEXT[] NOT NULL DEFAULT [],   -- the turns that proposed it
        signals         INTEGER NOT NULL DEFAULT 1,   -- how many turns said it
        proposed_at     TIMESTAMPTZ NOT NULL,
        expires_at      TIMESTAMPTZ NOT NULL,
        -- pending | accepted | rejected | expired | applied (corroborated) | stale
        status          TEXT NOT NULL DEFAULT 'pending',
        decided_at      TIMESTAMPTZ,
        decided_by      TEXT,
        result_id       TEXT,               -- the fact written when applied
        meta            JSON
    );

    CREATE OR REPLACE VIEW episodes AS
        SELECT id, turn_id, session_id, conversation_id, source_role AS role, speaker, content,
               event_time, line, path, user_id
        FROM memories WHERE kind = 'episode';

    """,
]

SCHEMA_VERSION = len(MIGRATIONS)

#: Tables whose rows belong to one workspace file (deleted with it).
FILE_OWNED_TABLES = ("notes", "chunks", "ingest_errors")

#: The second unique key of `relations` (beside its id): the conflict target its inserts name.
#: DuckDB 1.5 checks a row without one against both unique keys, in time that grows with the
#: table (`relations.write_edges`).
RELATIONS_EDGE_KEY = "(from_id, to_id, relation_type)"
