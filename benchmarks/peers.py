"""The systems `whole_graph.py` puts beside memory-dag, each built as its own docs suggest.

    python benchmarks/peers.py SYSTEM ACTION --workspace DIR --store DIR [--queries FILE]
        [--locomo DIR]

SYSTEM: `sqlite-vec` (seed 002's design: SQLite with FTS5 and sqlite-vec, a 0.7 / 0.3 blend of
cosine and BM25 over 4x candidates), `lancedb` (native FTS index plus vectors, its hybrid
query), `chromadb` (HNSW, vector only) or `memory-dag` (search and recall only: memory-dag
ingests through `memory-dag ingest`, the user's path).

ACTION: `sync` brings the store up to date with the workspace's transcripts (seed 002's sync:
size and mtime, then a hash, per file; the turns of new and changed files are embedded with
WordLlama, inside the timed region, and written; those of changed and deleted files removed),
`search` times the queries of `--queries` (a JSON list of [query, conversation]) unscoped and
scoped to their conversation, and `recall` ingests LoCoMo (`--locomo`) into `--store` and
measures turn-level recall@10 of its questions, each scoped to its conversation. One document
is one turn, `Speaker: text`, as memory-dag's default chunks are. The result is one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

K = 10
CANDIDATES = 4  # seed 002's candidate multiplier
VECTOR_WEIGHT, TEXT_WEIGHT = 0.7, 0.3


@dataclass(frozen=True)
class Doc:
    """One turn of a transcript: the unit every system indexes."""

    path: str
    line: int
    conversation: str
    session: str
    turn_id: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def read_transcript(workspace: Path, rel: str) -> list[Doc]:
    conversation = "/".join(rel.split("/")[1:-1])
    session = Path(rel).stem
    docs = []
    for line, raw in enumerate((workspace / rel).read_text().splitlines(), start=1):
        if not raw.strip():
            continue
        record = json.loads(raw)
        speaker = record.get("name") or str(record.get("role", "user")).capitalize()
        text = f"{speaker}: {record.get('content', '')}"
        docs.append(Doc(rel, line, conversation, session, str(record.get("id", line)), text))
    return docs


class Embedder:
    """WordLlama's own `embed`, loaded from the package (no download), vectors normalised."""

    def __init__(self) -> None:
        import wordllama

        self.model = wordllama.WordLlama.load(
            cache_dir=Path(wordllama.__file__).parent, disable_download=True
        )

    def __call__(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 256), dtype=np.float32)
        return np.asarray(self.model.embed(texts, norm=True), dtype=np.float32)


class Store(Protocol):
    def remove(self, paths: list[str]) -> None: ...
    def add(self, docs: list[Doc], vectors: np.ndarray) -> None: ...
    def commit(self, cold: bool) -> None: ...
    def search(self, vector: np.ndarray, text: str, conversation: str | None) -> list[str]: ...


# --- seed 002: SQLite + FTS5 + sqlite-vec ------------------------------------------------------


def _fts_query(text: str) -> str:
    words = re.findall(r"\w+", text.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words)) or '""'


class SqliteVecStore:
    def __init__(self, store: Path) -> None:
        import pysqlite3.dbapi2 as sqlite3  # the stdlib module here cannot load extensions
        import sqlite_vec

        store.mkdir(parents=True, exist_ok=True)
        self.con = sqlite3.connect(store / "memory.sqlite")
        self.con.enable_load_extension(True)
        sqlite_vec.load(self.con)
        self.con.enable_load_extension(False)
        self.con.executescript(
            """
            CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, doc TEXT UNIQUE,
                path TEXT, conversation TEXT, session TEXT, turn_id TEXT, text TEXT);
            CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path);
            CREATE VIRTUAL TABLE IF NOT EXISTS chunks_vec USING vec0(
                id INTEGER PRIMARY KEY, conversation TEXT partition key,
                embedding float[256] distance_metric=cosine);
            CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
                text, conversation UNINDEXED, tokenize='porter');
            """
        )

    def remove(self, paths: list[str]) -> None:
        for path in paths:
            ids = [r[0] for r in self.con.execute("SELECT id FROM chunks WHERE path = ?", [path])]
            for table in ("chunks", "chunks_vec", "chunks_fts"):
                column = "rowid" if table == "chunks_fts" else "id"
                self.con.executemany(f"DELETE FROM {table} WHERE {column} = ?", [[i] for i in ids])

    def add(self, docs: list[Doc], vectors: np.ndarray) -> None:
        start = self.con.execute("SELECT coalesce(max(id), 0) FROM chunks").fetchone()[0] + 1
        ids = range(start, start + len(docs))
        self.con.executemany(
            "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (i, d.id, d.path, d.conversation, d.session, d.turn_id, d.text)
                for i, d in zip(ids, docs, strict=True)
            ],
        )
        self.con.executemany(
            "INSERT INTO chunks_vec (id, conversation, embedding) VALUES (?, ?, ?)",
            [(i, d.conversation, v.tobytes()) for i, d, v in zip(ids, docs, vectors, strict=True)],
        )
        self.con.executemany(
            "INSERT INTO chunks_fts (rowid, text, conversation) VALUES (?, ?, ?)",
            [(i, d.text, d.conversation) for i, d in zip(ids, docs, strict=True)],
        )

    def commit(self, cold: bool) -> None:
        self.con.commit()

    def search(self, vector: np.ndarray, text: str, conversation: str | None) -> list[str]:
        where = " AND conversation = ?" if conversation else ""
        scope = [conversation] if conversation else []
        cosine = {
            row: 1.0 - distance
            for row, distance in self.con.execute(
                f"SELECT id, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ?{where}",
                [vector.tobytes(), K * CANDIDATES, *scope],
            )
        }
        bm25 = {
            row: -score
            for row, score in self.con.execute(
                f"SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ?{where} "
                "ORDER BY bm25(chunks_fts) LIMIT ?",
                [_fts_query(text), *scope, K * CANDIDATES],
            )
        }
        best = max(bm25.values(), default=0.0)
        scores = {
            row: VECTOR_WEIGHT * max(0.0, cosine.get(row, 0.0))
            + TEXT_WEIGHT * (bm25.get(row, 0.0) / best if best > 0 else 0.0)
            for row in cosine.keys() | bm25.keys()
        }
        top = sorted(scores, key=lambda row: -scores[row])[:K]
        if not top:
            return []
        found = dict(
            self.con.execute(
                f"SELECT id, doc FROM chunks WHERE id IN ({','.join('?' * len(top))})", top
            ).fetchall()
        )
        return [found[row] for row in top]


# --- LanceDB -----------------------------------------------------------------------------------


class LanceStore:
    def __init__(self, store: Path) -> None:
        import lancedb

        self.db = lancedb.connect(store / "lance")
        names = self.db.table_names()
        self.table = self.db.open_table("turns") if "turns" in names else None

    def remove(self, paths: list[str]) -> None:
        if self.table is not None and paths:
            listed = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
            self.table.delete(f"path IN ({listed})")

    def add(self, docs: list[Doc], vectors: np.ndarray) -> None:
        import pyarrow as pa

        if not docs:
            return
        rows = pa.table(
            {
                "doc": [d.id for d in docs],
                "path": [d.path for d in docs],
                "conversation": [d.conversation for d in docs],
                "turn_id": [d.turn_id for d in docs],
                "text": [d.text for d in docs],
                "vector": pa.FixedSizeListArray.from_arrays(
                    pa.array(vectors.reshape(-1)), vectors.shape[1]
                ),
            }
        )
        if self.table is None:
            self.table = self.db.create_table("turns", data=rows)
        else:
            self.table.add(rows)

    def commit(self, cold: bool) -> None:
        if self.table is None:
            return
        if cold:
            self.table.create_fts_index("text", use_tantivy=False, replace=True)
        else:
            self.table.optimize()  # brings the FTS index up to date with the new rows

    def search(self, vector: np.ndarray, text: str, conversation: str | None) -> list[str]:
        assert self.table is not None
        query = self.table.search(query_type="hybrid").vector(vector).text(text)
        if conversation:
            query = query.where(f"conversation = '{conversation}'", prefilter=True)
        return [row["doc"] for row in query.limit(K).select(["doc"]).to_list()]


# --- chromadb ----------------------------------------------------------------------------------


class ChromaStore:
    def __init__(self, store: Path) -> None:
        import chromadb

        self.client = chromadb.PersistentClient(path=str(store / "chroma"))
        self.collection = self.client.get_or_create_collection(
            "turns", metadata={"hnsw:space": "cosine"}
        )

    def remove(self, paths: list[str]) -> None:
        if paths:
            self.collection.delete(where={"path": {"$in": paths}})

    def add(self, docs: list[Doc], vectors: np.ndarray) -> None:
        batch = self.client.get_max_batch_size()
        for start in range(0, len(docs), batch):
            part = docs[start : start + batch]
            self.collection.add(
                ids=[d.id for d in part],
                embeddings=vectors[start : start + batch],
                documents=[d.text for d in part],
                metadatas=[
                    {"path": d.path, "conversation": d.conversation, "turn_id": d.turn_id}
                    for d in part
                ],
            )

    def commit(self, cold: bool) -> None:
        pass

    def search(self, vector: np.ndarray, text: str, conversation: str | None) -> list[str]:
        where = {"conversation": conversation} if conversation else None
        found = self.collection.query(query_embeddings=[vector], n_results=K, where=where)
        return list(found["ids"][0])


STORES = {"sqlite-vec": SqliteVecStore, "lancedb": LanceStore, "chromadb": ChromaStore}


# --- actions -----------------------------------------------------------------------------------


def sync(system: str, workspace: Path, store_dir: Path) -> dict[str, Any]:
    """Seed 002's sync of the transcripts into one system's store."""
    state_path = store_dir / "files.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    store = STORES[system](store_dir)
    embed = Embedder()
    seen: dict[str, list] = {}
    changed: list[str] = []
    for path in sorted((workspace / "sessions").rglob("*.jsonl")):
        rel = path.relative_to(workspace).as_posix()
        info = path.stat()
        before = state.get(rel)
        if before is not None and before[:2] == [info.st_size, info.st_mtime]:
            seen[rel] = before
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        seen[rel] = [info.st_size, info.st_mtime, digest]
        if before is None or before[2] != digest:
            changed.append(rel)
    deleted = sorted(set(state) - set(seen))
    store.remove([p for p in changed if p in state] + deleted)
    docs = [doc for rel in changed for doc in read_transcript(workspace, rel)]
    vectors = embed([d.text for d in docs])
    store.add(docs, vectors)
    if docs or deleted:
        store.commit(cold=not state)
    store_dir.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps(seen))
    return {"files_changed": len(changed), "files_deleted": len(deleted), "turns": len(docs)}


def search(system: str, settings_or_store: Path, queries: list[list[str]]) -> dict[str, Any]:
    """p50 / p95 ms of the queries, unscoped and scoped to their conversation (warm)."""
    ask = _searcher(system, settings_or_store)
    for query, conversation in queries[:20]:  # warm caches
        ask(query, None)
        ask(query, conversation)
    out: dict[str, Any] = {}
    for scope in ("unscoped", "scoped"):
        times = []
        for query, conversation in queries:
            started = time.perf_counter()
            ask(query, conversation if scope == "scoped" else None)
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        out[f"{scope}_p50_ms"] = round(statistics.median(times), 3)
        out[f"{scope}_p95_ms"] = round(times[int(0.95 * (len(times) - 1))], 3)
    return out


def recall(system: str, locomo: Path, store_dir: Path) -> dict[str, Any]:
    """Turn-level recall@10 on LoCoMo, each question scoped to its conversation."""
    from memory_dag.eval.locomo import questions, write_workspace

    files = sorted(locomo.glob("*.json"))
    workspace = store_dir / "workspace"
    write_workspace(files, workspace)
    if system == "memory-dag":
        from memory_dag.pipeline import run_all

        run_all(_memory_dag_settings(workspace, store_dir))
    else:
        sync(system, workspace, store_dir / "store")
    ask = _searcher(system, store_dir if system == "memory-dag" else store_dir / "store")
    turn_of = {  # a peer answers documents; memory-dag answers turns already
        doc.id: doc.turn_id
        for path in sorted((workspace / "sessions").rglob("*.jsonl"))
        for doc in read_transcript(workspace, path.relative_to(workspace).as_posix())
    }
    recalls = []
    for conversation, item, evidence in questions(files):
        turns = [turn_of.get(hit, hit) for hit in ask(item["question"], conversation)]
        recalls.append(len(set(turns[:K]) & set(evidence)) / len(evidence))
    return {"recall_at_10": round(statistics.fmean(recalls), 4), "questions": len(recalls)}


def _memory_dag_settings(workspace: Path, root: Path) -> Any:
    from memory_dag.config import Settings

    return Settings(workspace=workspace, db_path=root / "memory.duckdb", index_dir=root / "index")


def _searcher(system: str, where: Path) -> Any:
    """(query, conversation) → ranked turn ids (memory-dag) or document ids (the peers)."""
    if system == "memory-dag":
        from memory_dag.config import Settings
        from memory_dag.eval.locomo import ranked_turns
        from memory_dag.index.search import Searcher, SearchFilters

        settings = Settings.load(db_path=where / "memory.duckdb", index_dir=where / "index")
        searcher = Searcher(settings)

        def ask_memory_dag(query: str, conversation: str | None) -> list[str]:
            scope = SearchFilters(conversation=conversation) if conversation else None
            return ranked_turns(searcher.search(query, k=K, filters=scope, min_score=0.0), K)

        return ask_memory_dag
    store = STORES[system](where)
    embed = Embedder()

    def ask_peer(query: str, conversation: str | None) -> list[str]:
        return store.search(embed([query])[0], query, conversation)

    return ask_peer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("system", choices=[*STORES, "memory-dag"])
    parser.add_argument("action", choices=["sync", "search", "recall"])
    parser.add_argument("--workspace", type=Path)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--queries", type=Path)
    parser.add_argument("--locomo", type=Path)
    args = parser.parse_args()
    if args.action == "sync":
        result = sync(args.system, args.workspace, args.store)
    elif args.action == "search":
        result = search(args.system, args.store, json.loads(args.queries.read_text()))
    else:
        result = recall(args.system, args.locomo, args.store)
    print(json.dumps(result), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
