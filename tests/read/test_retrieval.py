"""The read-path stages: their arithmetic on hand-made candidates, and the stages over a real
store (liveness, relations, entities, access tracking, a busy store)."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.ids import episode_id
from memory_dag.index.published import publish_index
from memory_dag.index.search import SearchFilters
from memory_dag.pipeline import run_first_stages
from memory_dag.read.access_log import AccessLog, access_log_dir, apply_access_log
from memory_dag.read.retriever import RetrievalConfig, Retriever
from memory_dag.read.scoring import (
    RRF_K,
    min_max,
    mmr_order,
    recency_score,
    rrf_scores,
    with_recency,
)
from memory_dag.store.connection import open_store
from tests.onnx_fixtures import build_cross_encoder
from tests.store.test_store import hold_lock

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
#: Every stage off: what is left is the candidates' fused order.
BARE = dict(store_signals=False, rerank=False, threshold=False, recency=False, relations=False,
            insight=False, mmr=False, track_access=False)  # fmt: skip


# --- helpers shared with read/test_query.py and read/test_context_block.py ------------------------


def publish_rows(index_dir: Path, rows: list[dict[str, Any]]) -> Settings:
    """A hand-made index of `rows` (id, text, and any other row column), WordLlama vectors."""
    settings = Settings(index_dir=index_dir, db_path=index_dir.parent / "none.duckdb")
    provider = get_provider(settings)
    columns: dict[str, list[Any]] = {
        "id": [r["id"] for r in rows],
        "kind": [r.get("kind", "fact") for r in rows],
        "source": [r.get("source", "memories") for r in rows],
        "path": [r.get("path", r["id"]) for r in rows],  # one path each: no neighbour boosts
        "start_line": [0] * len(rows),
        "end_line": [0] * len(rows),
        "text": [r["text"] for r in rows],
        "search_text": [r["text"] for r in rows],
    }
    for name in ("event_time", "category", "user_id", "session_id", "conversation_id"):
        columns[name] = [r.get(name) for r in rows]
    vectors = provider.embed([r["text"] for r in rows])
    publish_index(
        index_dir,
        pa.table(columns),
        vectors,
        provider=provider.name,
        model=provider.model,
        fingerprint="hand-made",
    )
    return settings


def add_memories(settings: Settings, memories: list[dict[str, Any]]) -> None:
    """Insert rows into `memories` as the write path would (active, created now)."""
    with open_store(settings.db_path) as con:
        for memory in memories:
            row = {"kind": "fact", "importance": 2, "created_at": NOW, **memory}
            names = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            con.execute(f"INSERT INTO memories ({names}) VALUES ({marks})", list(row.values()))


def add_relation(settings: Settings, from_id: str, to_id: str, strength: float) -> None:
    with open_store(settings.db_path) as con:
        con.execute(
            "INSERT INTO relations (id, from_id, to_id, strength) VALUES (?, ?, ?, ?)",
            [f"{from_id}-{to_id}", from_id, to_id, strength],
        )


FACTS = [
    {"id": "f_deploy", "content": "Dana must ship the deploy plan for the billing service",
     "conversation_id": "conv-a", "category": "tasks", "user_id": "dana", "importance": 4},
    {"id": "f_tea", "content": "Dana prefers green tea over coffee", "conversation_id": "conv-a",
     "category": "preferences", "user_id": "dana"},
    {"id": "f_rollback", "content": "Dana wants a rollback step in every deploy plan",
     "conversation_id": "conv-a", "category": "goals", "user_id": "dana"},
    {"id": "f_priya", "content": "Priya reviews the deploy plan before release",
     "conversation_id": "conv-a", "category": "relationships", "user_id": "dana"},
    {"id": "i_trust", "kind": "insight", "content": "Dana trusts deploy advice after a mistake "
     "is admitted", "conversation_id": "conv-a", "category": "relationship_dynamic",
     "user_id": "dana"},
]  # fmt: skip


@pytest.fixture
def store(settings: Settings) -> Settings:
    """The conftest workspace plus a few facts, ingested and indexed."""
    run_first_stages(settings)
    add_memories(settings, FACTS)
    run_first_stages(settings)
    return settings


# --- stage arithmetic ----------------------------------------------------------------------


def test_rrf_sums_reciprocal_ranks_with_k_60() -> None:
    scores = rrf_scores([["a", "b", "c"], ["b", "a"], ["c"]])

    assert RRF_K == 60
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert rrf_scores([["x", "y"]], k=1) == {"x": 1 / 2, "y": 1 / 3}


def test_recency_is_exponential_in_age_over_30_days() -> None:
    assert recency_score(0.0) == 1.0
    assert recency_score(30.0) == pytest.approx(math.exp(-1))
    assert recency_score(90.0, scale_days=30.0) == pytest.approx(math.exp(-3))
    assert recency_score(-5.0) == 1.0  # a future date counts as now
    assert with_recency(0.8, math.exp(-1), 0.2) == pytest.approx(0.8 * 0.8 + 0.2 * math.exp(-1))


def test_mmr_picks_a_different_memory_before_a_near_duplicate() -> None:
    scores = np.array([1.0, 0.95, 0.6])
    vectors = np.array([[1.0, 0.0], [0.99, 0.01], [0.0, 3.0]])  # 0 ≈ 1; 2 orthogonal

    # 2nd pick: 1 → 0.7·0.95 − 0.3·cos(0,1) ≈ 0.365; 2 → 0.7·0.6 − 0 = 0.42.
    assert mmr_order(scores, vectors, 3, lam=0.7) == [0, 2, 1]
    assert mmr_order(scores, vectors, 3, lam=1.0) == [0, 1, 2]  # λ = 1: relevance only
    assert mmr_order(scores, vectors, 1, lam=0.7) == [0]
    assert mmr_order(np.array([]), np.zeros((0, 2)), 3, lam=0.7) == []


# --- stages on a hand-made index -----------------------------------------------------------


def test_recency_stage_applies_the_formula_and_prefers_the_recent_twin(tmp_path: Path) -> None:
    text = "the quarterly budget review meeting"
    settings = publish_rows(
        tmp_path / "index",
        [
            {"id": "old", "text": text, "event_time": NOW - timedelta(days=90)},
            {"id": "new", "text": text, "event_time": NOW - timedelta(days=3)},
            {"id": "undated", "text": "budget review notes"},
            {"id": "other", "text": "a recipe for lemon cake"},
        ],
    )
    config = RetrievalConfig(**{**BARE, "recency": True, "fusion": "blend"})

    result = Retriever(settings, config).retrieve("budget review", top_k=4, now=NOW)

    by_id = {c.hit.id: c for c in result.items}
    assert by_id["old"].relevance == pytest.approx(by_id["new"].relevance)
    assert [c.hit.id for c in result.items].index("new") < [c.hit.id for c in result.items].index(
        "old"
    )
    for name, days in (("old", 90), ("new", 3)):
        candidate = by_id[name]
        assert candidate.recency == pytest.approx(math.exp(-days / 30))
        assert candidate.score == pytest.approx(
            0.8 * candidate.relevance + 0.2 * math.exp(-days / 30)
        )
    assert by_id["undated"].recency is None
    assert by_id["undated"].score == by_id["undated"].relevance
    assert result.stage("recency").ran


def test_threshold_drops_exactly_the_candidates_below_it(tmp_path: Path) -> None:
    settings = publish_rows(
        tmp_path / "index",
        [{"id": f"r{i}", "text": t} for i, t in enumerate(
            ["budget review", "budget planning for the review", "lemon cake recipe",
             "a walk in the park", "budget", "quarterly review of the budget"])],
    )  # fmt: skip
    unpruned = Retriever(settings, RetrievalConfig(**BARE)).retrieve("budget review", top_k=10)
    relevance = sorted(c.relevance for c in unpruned.items)
    cut = (relevance[1] + relevance[-2]) / 2  # some below, some above
    config = RetrievalConfig(**{**BARE, "threshold": True})

    pruned = Retriever(settings, config).retrieve("budget review", top_k=10, threshold=cut)

    expected = {c.hit.id for c in unpruned.items if c.relevance >= cut}
    assert {c.hit.id for c in pruned.items} == expected
    assert 0 < len(expected) < len(unpruned.items)
    assert pruned.stage("threshold").detail == f"relevance >= {cut}"


def test_rerank_scores_with_the_cross_encoder_and_prunes_below_threshold(tmp_path: Path) -> None:
    model = build_cross_encoder(tmp_path / "reranker")
    texts = ["the cat sat on the mat", "a dog ran far", "a bird sang loud", "the dog sat",
             "the cat ran", "a mat"]  # fmt: skip
    settings = publish_rows(tmp_path / "index", [{"id": t, "text": t} for t in texts])
    query = "the cat"
    relevance = {t: 1 / (1 + math.exp(-model.expected_logit(query, t))) for t in texts}
    config = RetrievalConfig(
        **{**BARE, "rerank": True, "threshold": True, "reranker_model": str(model.folder)}
    )

    result = Retriever(settings, config).retrieve(query, top_k=10)

    kept = {t for t in texts if relevance[t] >= 0.35}
    assert 0 < len(kept) < len(texts)  # the fixture weights prune some and keep some
    assert {c.hit.id for c in result.items} == kept
    for candidate in result.items:
        assert candidate.relevance == pytest.approx(relevance[candidate.hit.id], rel=1e-5)
    assert [c.relevance for c in result.items] == sorted(
        (c.relevance for c in result.items), reverse=True
    )
    assert result.relevance_source == "reranker"
    assert result.stage("rerank").ran and result.stage("rerank").detail == str(model.folder)


def test_without_a_reranker_the_fused_score_stands_and_the_result_says_so(
    tmp_path: Path,
) -> None:
    settings = publish_rows(tmp_path / "index", [{"id": "a", "text": "budget review"}])

    result = Retriever(settings, RetrievalConfig(**{**BARE, "rerank": True})).retrieve("budget")

    assert result.relevance_source == "fused"
    assert not result.stage("rerank").ran
    assert "no reranker model" in result.stage("rerank").detail
    assert result.items[0].relevance == result.items[0].fused == result.items[0].hit.score


def test_insights_get_a_low_weight(tmp_path: Path) -> None:
    text = "Dana feels calmer when plans are written down"
    settings = publish_rows(
        tmp_path / "index",
        [{"id": "fact", "text": text}, {"id": "insight", "text": text, "kind": "insight"}],
    )
    config = RetrievalConfig(**{**BARE, "insight": True, "insight_weight": 0.5})

    result = Retriever(settings, config).retrieve("written plans", top_k=2)

    fact, insight = result.items
    assert (fact.hit.id, insight.hit.id) == ("fact", "insight")
    assert insight.score == pytest.approx(0.5 * insight.relevance)
    assert fact.score == fact.relevance


def test_mmr_stage_replaces_a_duplicate_with_another_relevant_memory(tmp_path: Path) -> None:
    settings = publish_rows(
        tmp_path / "index",
        [
            {"id": "dup1", "text": "Dana goes hiking every weekend"},
            {"id": "dup2", "text": "Dana goes hiking every weekend"},
            {"id": "other", "text": "Dana goes hiking with her sister in spring"},
            {"id": "far", "text": "the invoice template uses a blue header"},
            {"id": "far2", "text": "lemon cake recipe"},
        ],
    )
    plain = Retriever(settings, RetrievalConfig(**BARE)).retrieve("Dana hiking", top_k=3)
    config = RetrievalConfig(**{**BARE, "mmr": True})

    diverse = Retriever(settings, config).retrieve("Dana hiking", top_k=3)

    assert [c.hit.id for c in plain.items] == ["dup1", "dup2", "other"]
    # scaled scores: dup1 1, dup2 1, other ≈ 0.9, far ≈ 0; 2nd pick: dup2 0.7 − 0.3·1 = 0.4,
    # other ≈ 0.63 − 0.3·0.63 ≈ 0.44, far ≈ 0 + 0.3·0.04: the other hike, not the duplicate.
    assert [c.hit.id for c in diverse.items] == ["dup1", "other", "dup2"]
    assert diverse.stage("mmr").ran and not plain.stage("mmr").ran


def test_min_max_scaling_for_mmr() -> None:
    np.testing.assert_allclose(min_max(np.array([0.4, 0.6, 0.5])), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(min_max(np.array([0.3, 0.3])), [1.0, 1.0])
    assert len(min_max(np.array([]))) == 0


def test_stages_that_are_off_are_recorded_as_not_run(tmp_path: Path) -> None:
    settings = publish_rows(tmp_path / "index", [{"id": "a", "text": "budget review"}])

    result = Retriever(settings, RetrievalConfig(**BARE)).retrieve("budget")

    assert result.ran() == ["candidates"]
    assert [s.name for s in result.stages] == [
        "candidates", "liveness", "entities", "rerank", "threshold", "recency", "relations",
        "insight", "current", "mmr",
    ]  # fmt: skip


# --- stages over a real store --------------------------------------------------------------


def test_relation_boost_adds_weight_times_the_strongest_live_relation(store: Settings) -> None:
    add_relation(store, "f_deploy", "f_rollback", 0.9)
    add_relation(store, "f_priya", "f_deploy", 0.4)
    config = RetrievalConfig(**{**BARE, "store_signals": True, "relations": True})
    plain = Retriever(store, RetrievalConfig(**{**BARE, "store_signals": True}))

    before = {c.hit.id: c for c in plain.retrieve("deploy plan", top_k=10).items}
    result = Retriever(store, config).retrieve("deploy plan", top_k=10)

    after = {c.hit.id: c for c in result.items}
    assert after["f_deploy"].relation_strength == 0.9  # the strongest, either direction
    assert after["f_rollback"].relation_strength == 0.9
    assert after["f_priya"].relation_strength == 0.4
    assert after["f_tea"].relation_strength == 0.0
    for memory_id, strength in (("f_deploy", 0.9), ("f_priya", 0.4), ("f_tea", 0.0)):
        assert after[memory_id].score == pytest.approx(before[memory_id].score + 0.1 * strength)


def test_related_memories_are_live_and_not_already_shown(store: Settings) -> None:
    add_memories(store, [{"id": "f_gone", "content": "Dana used to deploy on Mondays",
                          "valid_until": NOW, "state": "soft_deleted"}])  # fmt: skip
    add_relation(store, "f_deploy", "f_gone", 0.95)
    add_relation(store, "f_deploy", "f_tea", 0.8)
    config = RetrievalConfig(**{**BARE, "store_signals": True, "relations": True})

    result = Retriever(store, config).retrieve(
        "deploy plan billing", top_k=1, filters=SearchFilters(kind="fact")
    )

    assert [c.hit.id for c in result.items] == ["f_deploy"]
    assert [(r.id, r.related_to, r.strength) for r in result.related] == [
        ("f_tea", "f_deploy", 0.8)
    ]
    assert result.related[0].text == "Dana prefers green tea over coffee"


def test_memories_soft_deleted_after_publishing_are_never_returned(store: Settings) -> None:
    retriever = Retriever(store, RetrievalConfig(**{**BARE, "store_signals": True}))
    before = retriever.retrieve("deploy plan billing service", top_k=10)
    again = retriever.retrieve("deploy plan billing service", top_k=10)
    with open_store(store.db_path) as con:
        con.execute(
            "UPDATE memories SET valid_until = now(), state = 'soft_deleted' WHERE id = 'f_deploy'"
        )

    after = retriever.retrieve("deploy plan billing service", top_k=10)

    assert "f_deploy" in {c.hit.id for c in before.items}
    assert again.stage("liveness").detail == "0 no longer active (snapshot)"  # not re-read
    assert "f_deploy" not in {c.hit.id for c in after.items}
    assert after.stage("liveness").detail == "1 no longer active (read)"  # the store changed


def test_a_busy_store_skips_store_stages_without_waiting(store: Settings) -> None:
    holder = hold_lock(store.db_path, 5)
    try:
        started = time.perf_counter()
        result = Retriever(store, RetrievalConfig(track_access=False)).retrieve("deploy plan")
        seconds = time.perf_counter() - started
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipes
    assert seconds < 2.0
    assert result.items
    assert not result.stage("liveness").ran and "store busy" in result.stage("liveness").detail
    assert not result.stage("relations").ran


def test_entity_matches_are_a_third_rrf_ranking(store: Settings) -> None:
    question = "What did Priya say about the deploy plan?"
    with open_store(store.db_path) as con:
        con.execute("INSERT INTO entities (id, canonical_name, type, aliases) VALUES "
                    "('ent_priya', 'Priya', 'person', ['Priya R.'])")  # fmt: skip
        con.execute("INSERT INTO memory_entities (memory_id, entity_id) VALUES "
                    "('f_priya', 'ent_priya')")  # fmt: skip
    base = {**BARE, "store_signals": True, "fusion": "rrf"}
    plain = Retriever(store, RetrievalConfig(**base)).retrieve(question, top_k=30)
    config = RetrievalConfig(**{**base, "entities": True})

    result = Retriever(store, config).retrieve(question, top_k=30)

    assert result.stage("entities").ran
    pool = plain.items
    text = sorted((c for c in pool if c.hit.text_score > 0), key=lambda c: -c.hit.text_score)
    vector = sorted(pool, key=lambda c: -c.hit.vector_score)
    entity = [c for c in pool if c.hit.id == "f_priya"]
    expected = rrf_scores([[c.hit.id for c in r] for r in (text, vector, entity)])
    best = 3 / (RRF_K + 1)
    for candidate in result.items:
        assert candidate.relevance == pytest.approx(expected[candidate.hit.id] / best)
    assert result.items[0].hit.id == "f_priya"
    assert result.items[0].entity_matches == 1


def test_exclude_session_leaves_out_the_current_session(store: Settings) -> None:
    config = RetrievalConfig(**BARE)
    scope = SearchFilters(conversation="conv-a")

    everything = Retriever(store, config).retrieve("Miso cat basil", top_k=20, filters=scope)
    without = Retriever(store, config).retrieve(
        "Miso cat basil", top_k=20, filters=scope, exclude_session="s2"
    )

    assert "s2" in {c.hit.session_id for c in everything.items}
    assert without.items and "s2" not in {c.hit.session_id for c in without.items}


# --- access tracking -----------------------------------------------------------------------


def test_accesses_are_queued_off_the_hot_path_and_applied_exactly_once(store: Settings) -> None:
    log = AccessLog(access_log_dir(store), flush_seconds=3600)  # only explicit flushes
    config = RetrievalConfig(**{**BARE, "track_access": True})
    retriever = Retriever(store, config, access_log=log)

    first = retriever.retrieve("green tea", top_k=1, filters=SearchFilters(kind="fact"), now=NOW)
    retriever.retrieve("green tea", top_k=1, filters=SearchFilters(kind="fact"), now=NOW)
    turn = retriever.retrieve("Priya Toronto", top_k=1, filters=SearchFilters(kind="transcript"))

    assert [c.hit.id for c in first.items] == ["f_tea"]
    assert not list(log.folder.glob("*.jsonl"))  # nothing written during the reads
    assert log.flush() == 3
    queued = [json.loads(line) for f in log.folder.glob("*.jsonl") for line in f.open()]
    assert [q["id"] for q in queued] == ["f_tea", "f_tea", episode_id(turn.items[0].hit.path, "t3")]

    assert apply_access_log(store) == {"files": 1, "accesses": 3, "memories": 2}
    assert apply_access_log(store) == {"files": 0, "accesses": 0, "memories": 0}
    with open_store(store.db_path, read_only=True) as con:
        counts = dict(con.execute(
            "SELECT id, access_count FROM memories WHERE access_count > 0").fetchall())  # fmt: skip
        last = con.execute("SELECT last_accessed FROM memories WHERE id = 'f_tea'").fetchone()[0]
    assert counts == {"f_tea": 2, episode_id(turn.items[0].hit.path, "t3"): 1}
    assert last == NOW


def test_a_queue_file_applied_before_a_crash_is_not_counted_again(store: Settings) -> None:
    log = AccessLog(access_log_dir(store), flush_seconds=3600)
    log.record(["f_tea"], NOW)
    log.flush()
    kept = {f: f.read_text() for f in log.folder.glob("*.jsonl")}
    apply_access_log(store)
    for path, text in kept.items():  # as if the process died before deleting the file
        path.write_text(text)

    assert apply_access_log(store)["accesses"] == 0
    with open_store(store.db_path, read_only=True) as con:
        assert con.execute(
            "SELECT access_count FROM memories WHERE id = 'f_tea'").fetchone()[0] == 1  # fmt: skip


def test_the_background_thread_flushes_without_being_asked(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / "queue", flush_seconds=0.05)

    log.record(["m1", "m2"], NOW)

    deadline = time.monotonic() + 5
    while not list(log.folder.glob("*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = [json.loads(x) for f in log.folder.glob("*.jsonl") for x in f.open()]
    assert [line["id"] for line in lines] == ["m1", "m2"]
    assert not list(log.folder.glob(".*.tmp"))


# --- the nightly evaluation asset ----------------------------------------------------------


def write_locomo(path: Path) -> Path:
    """A one-conversation LoCoMo file: one answerable question, one whose evidence is missing."""
    turns = [
        ("Ana", "I just adopted a golden retriever puppy named Biscuit!"),
        ("Ben", "That is wonderful, how old is Biscuit?"),
        ("Ana", "Biscuit is ten weeks old and chews every shoe in the flat."),
        ("Ben", "My sister runs a bakery in Porto, you should visit."),
    ]
    conversation = {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": s, "dia_id": f"D1:{i}", "text": t} for i, (s, t) in enumerate(turns, 1)
        ],
    }
    qa = [
        {"question": "What is the name of Ana's puppy?", "evidence": ["D1:1"], "category": 4},
        {"question": "Where does Ben's cousin live?", "evidence": ["D1:99"], "category": 4},
    ]
    path.write_text(json.dumps({"conversation": conversation, "qa": qa}))
    return path


def test_the_evaluation_asset_fails_its_check_below_the_recall_floor(tmp_path: Path) -> None:
    import dagster as dg

    from assets.eval import retrieval_evaluation
    from assets.resources import MemoryStoreResource

    data = write_locomo(tmp_path / "conv.json")  # recall@k = 0.5: one of two questions
    config = {"data": str(data), "recall_at_10_floor": 0.6, "recall_at_5_floor": 0.5}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [retrieval_evaluation],
            resources={"memory": MemoryStoreResource()},
            instance=instance,
            run_config={"ops": {"retrieval_evaluation": {"config": config}}},
        )
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"recall_at_10_above_floor": False, "recall_at_5_above_floor": True}
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["recall@10"].value == metadata["recall@5"].value == 0.5
    assert metadata["profile"].value == "defaults, recency off"
    assert "+ mmr (defaults)" in metadata["stages"].value  # every stage's row is shown
