"""memory.query: allowlists, user scoping, filters inside the index, procedural memories, the
token budget, and the categories file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.ingest.tokens import count_tokens
from memory_dag.memories.categories import AccessDenied, CategoryConfig, load_categories
from memory_dag.pipeline import run_first_stages
from memory_dag.read.query import (
    MemoryBullet,
    MemoryFull,
    MemoryQuery,
    fit_results,
    fit_tokens,
    query_memory,
)
from memory_dag.read.retriever import RetrievalConfig
from memory_dag.scope import Scope, ScopeRequired
from tests.conftest import write_jsonl
from tests.read.test_retrieval import add_memories

MEMORIES = [
    {"id": "a_deploy", "content": "Alice must finish the deploy plan for the billing service",
     "category": "tasks", "user_id": "alice", "importance": 2},
    {"id": "a_deploy_key", "content": "Alice must rotate the deploy key before the release",
     "category": "tasks", "user_id": "alice", "importance": 5},
    {"id": "a_tea", "content": "Alice prefers green tea during deploy reviews",
     "category": "preferences", "user_id": "alice"},
    {"id": "a_steps", "kind": "procedural", "category": "procedural", "user_id": "alice",
     "content": "1. Run the tests. 2. Tag the release. 3. Deploy with make deploy."},
    {"id": "b_deploy", "content": "Bob must deploy the billing service on Friday",
     "category": "tasks", "user_id": "bob", "importance": 5},
    {"id": "b_goal", "content": "Bob wants to automate every deploy plan", "category": "goals",
     "user_id": "bob", "importance": 4},
    {"id": "sum", "kind": "summary", "content": "Alice and Bob discussed the deploy plan.",
     "conversation_id": "conv-a"},
]  # fmt: skip
#: No store reads and no access log: these tests are about what the query may see.
QUIET = RetrievalConfig(store_signals=False, track_access=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Built once: these tests only read (QUIET keeps even the access log out)."""
    root = tmp_path_factory.mktemp("query-store")
    write_jsonl(
        root / "workspace" / "sessions" / "conv-a" / "s1.jsonl",
        [{"role": "user", "content": "I adopted a cat named Miso.", "id": "t1", "name": "Dana"}],
    )
    settings = Settings(
        workspace=root / "workspace", db_path=root / "memory.duckdb", index_dir=root / "index"
    )
    run_first_stages(settings)
    add_memories(settings, MEMORIES)
    run_first_stages(settings)
    return settings


def ask(settings: Settings, user: str | None = "alice", **request: object) -> list[str]:
    query = MemoryQuery.model_validate({"agent": "planner", "query": "deploy plan", **request})
    scope = Scope.of(user_id=user)
    response = query_memory(query, scope=scope, settings=settings, config=QUIET)
    return [r.id for r in response.results]


# --- allowlists ------------------------------------------------------------------------------


def test_a_planner_asking_for_preferences_is_rejected(store: Settings) -> None:
    with pytest.raises(AccessDenied) as rejected:
        ask(store, categories=["tasks", "preferences"])
    message = str(rejected.value)
    assert "'planner' may not read ['preferences']" in message
    assert "goals" in message and "tasks" in message  # the allowlist is named


@pytest.mark.parametrize(
    "request_fields, reason",
    [
        ({"agent": "intruder"}, "unknown agent 'intruder'"),
        ({"categories": ["nonsense"]}, "unknown categories ['nonsense']"),
        ({"filters": {"category": "preferences"}}, "may not read ['preferences']"),
    ],
)
def test_other_requests_outside_the_allowlist_are_rejected(
    store: Settings, request_fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(AccessDenied, match=reason.replace("[", r"\[").replace("]", r"\]")):
        ask(store, **request_fields)


def test_without_categories_the_allowlist_is_read(store: Settings) -> None:
    assert set(ask(store, "bob", top_k=20, threshold=0.0)) == {"b_deploy", "b_goal"}


def test_a_filter_category_narrows_within_the_allowlist(store: Settings) -> None:
    found = ask(store, "bob", top_k=20, threshold=0.0, filters={"category": "goals"})
    assert found == ["b_goal"]


# --- user scope ----------------------------------------------------------------------------


def test_filters_cannot_read_another_users_memories(store: Settings) -> None:
    with pytest.raises(AccessDenied, match="not the caller's user"):
        ask(store, user="alice", filters={"user_id": "bob"})

    everything_alice_may_ask = [
        {},
        {"filters": {"user_id": "alice"}},
        {"categories": ["goals"]},
        {"filters": {"importance_min": 4}},
        {"filters": {"pinned": False, "role": None}},
        {"categories": ["procedural"]},
    ]
    for request in everything_alice_may_ask:
        found = ask(store, user="alice", top_k=20, threshold=0.0, **request)
        assert not any(memory_id.startswith("b_") for memory_id in found), request
    assert set(ask(store, user="alice", top_k=20, threshold=0.0)) == {"a_deploy", "a_deploy_key"}


def test_an_unbound_caller_names_the_user_in_its_filters_or_is_refused(store: Settings) -> None:
    assert set(ask(store, None, top_k=20, threshold=0.0, filters={"user_id": "bob"})) == {
        "b_deploy",
        "b_goal",
    }
    with pytest.raises(ScopeRequired, match="2 users"):
        ask(store, None, top_k=20, threshold=0.0)  # a store of two users: no user, no answer


# --- filters inside the index --------------------------------------------------------------


def test_filters_apply_before_ranking_not_to_a_shortened_list(store: Settings) -> None:
    unfiltered = ask(store, user="alice", top_k=1, threshold=0.0)
    assert unfiltered == ["a_deploy"]  # the closer match to "deploy plan"

    assert ask(store, user="alice", top_k=1, threshold=0.0, filters={"importance_min": 4}) == [
        "a_deploy_key"
    ]


def test_threshold_drops_low_relevance_results(store: Settings) -> None:
    loose = ask(store, top_k=20, threshold=0.0)
    assert ask(store, top_k=20, threshold=1.0) == []
    assert len(loose) == 2


# --- procedural memories and summaries -----------------------------------------------------


def test_procedural_memories_only_when_asked_for(store: Settings) -> None:
    assert "a_steps" not in ask(store, top_k=20, threshold=0.0)
    assert ask(store, top_k=20, threshold=0.0, categories=["procedural"]) == ["a_steps"]


def test_uncategorised_turns_are_read_as_the_uncategorized_category(store: Settings) -> None:
    query = MemoryQuery(agent="supervisor", query="cat Miso", top_k=20, threshold=0.0)
    # Turns are shared by their conversation: a user reads them when naming it.
    scope = Scope.of(user_id="alice", conversation_id="conv-a")
    results = query_memory(query, scope=scope, settings=store, config=QUIET).results
    turns = [r for r in results if r.id.startswith("ep_")]

    assert turns and all(r.category == "event" for r in turns)
    assert not [r for r in results if r.id == "sum"]  # summaries are not ranked with memories
    planner = query.model_copy(update={"agent": "planner"})
    assert not [r for r in query_memory(planner, scope=scope, settings=store, config=QUIET).results
                if r.id.startswith("ep_")]  # fmt: skip
    alone = query_memory(query, scope=Scope.of(user_id="alice"), settings=store, config=QUIET)
    assert not [r for r in alone.results if r.id.startswith("ch_")]  # no conversation named


# --- responses and the budget --------------------------------------------------------------


def test_bullets_and_full_results(store: Settings) -> None:
    request = {"agent": "planner", "query": "rotate the deploy key", "top_k": 1}
    alice = Scope.of(user_id="alice")
    bullets = query_memory(
        MemoryQuery.model_validate(request), scope=alice, settings=store, config=QUIET
    )
    full = query_memory(
        MemoryQuery.model_validate({**request, "return": "full"}),
        scope=alice,
        settings=store,
        config=QUIET,
    )

    assert bullets.results == [
        MemoryBullet(
            id="a_deploy_key",
            category="tasks",
            text="[tasks] Alice must rotate the deploy key before the release",
        )
    ]
    item = full.results[0]
    assert isinstance(item, MemoryFull)
    assert item.text == "Alice must rotate the deploy key before the release"
    assert (item.kind, item.source, item.category) == ("fact", "memories", "tasks")
    assert 0.0 < item.relevance <= 1.0
    assert bullets.model_dump(by_alias=True)["return"] == "bullets"
    assert bullets.relevance_source == "fused" and "mmr" in bullets.stages


def test_the_budget_is_never_exceeded(store: Settings) -> None:
    for budget in (1, 2, 3, 5, 8, 13, 21, 34, 55):
        request = MemoryQuery(
            agent="planner", query="deploy plan", top_k=10, threshold=0.0, budget_tokens=budget
        )
        response = query_memory(
            request, scope=Scope.of(user_id="bob"), settings=store, config=QUIET
        )
        used = sum(count_tokens(r.text) for r in response.results)
        assert used == response.tokens <= budget, budget
        assert response.results  # even a tiny budget gets (a cut of) the best result
        assert response.dropped == 2 - len(response.results)


def test_results_are_kept_whole_and_only_a_lone_first_result_is_cut() -> None:
    results = [MemoryBullet(id=str(i), category="tasks", text="word " * n) for i, n in
               enumerate([10, 10, 30, 5])]  # fmt: skip

    kept, tokens = fit_results(results, 25)
    assert [r.id for r in kept] == ["0", "1"]  # the 5-token one after the 30 is not used
    assert tokens == count_tokens(results[0].text) + count_tokens(results[1].text)

    cut, tokens = fit_results(results, 4)
    assert len(cut) == 1 and cut[0].text.endswith("…") and tokens <= 4


def test_fit_tokens_cuts_to_the_budget() -> None:
    text = "Dana moved to Lisbon in May and started learning Portuguese with a tutor."
    assert fit_tokens(text, 100) == text
    for budget in range(1, count_tokens(text)):
        cut = fit_tokens(text, budget)
        assert count_tokens(cut) <= budget
        assert cut == "" or cut.endswith("…")


# --- request model -------------------------------------------------------------------------


def test_the_request_matches_the_seed_json() -> None:
    request = MemoryQuery.model_validate(
        {
            "agent": "planner",
            "query": "deployment plan context",
            "categories": ["tasks", "projects"],
            "filters": {"user_id": "u1", "agent_id": "a1", "run_id": "r1", "actor_id": "x",
                        "role": "assistant", "pinned": False, "importance_min": 1,
                        "importance_max": 5, "updated_after": "2025-07-01",
                        "updated_before": None},
            "top_k": 3,
            "return": "bullets",
            "budget_tokens": 512,
            "threshold": 0.65,
        }
    )  # fmt: skip
    assert request.return_ == "bullets" and request.filters.updated_after.year == 2025
    with pytest.raises(ValidationError):
        MemoryQuery.model_validate({"agent": "planner", "query": "x", "filters": {"tenant": 1}})
    with pytest.raises(ValidationError):
        MemoryQuery.model_validate({"agent": "planner", "query": "x", "return": "everything"})


# --- the categories file -------------------------------------------------------------------


def test_the_packaged_categories_follow_the_seed() -> None:
    config = load_categories()
    assert config.allowlist("planner") == ["goals", "tasks", "projects", "procedural"]
    assert config.get("profile").context == "all"
    assert config.get("activity").rag_length == 50
    assert config.resolve("planner", None) == ["goals", "tasks", "projects"]


def test_a_categories_file_naming_undefined_categories_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "categories.yaml"
    path.write_text(
        "categories:\n  system:\n    - name: tasks\n  custom: []\n"
        "allowlists:\n  planner: [tasks, secrets]\n"
    )
    with pytest.raises(ValidationError, match="undefined secrets"):
        load_categories(path)


def test_the_categories_file_can_be_chosen_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "categories:\n  system:\n    - name: notes\n"
        "uncategorized: notes\nallowlists:\n  scribe: [notes]\n"
    )
    monkeypatch.setenv("MEMORY_DAG_CATEGORIES", str(path))
    config = load_categories()
    assert isinstance(config, CategoryConfig)
    assert config.allowlist("scribe") == ["notes"]


# --- CLI -----------------------------------------------------------------------------------


def test_cli_query_prints_bullets_and_rejects_disallowed_categories(
    store: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = ["--db", str(store.db_path), "--index-dir", str(store.index_dir)]
    args = ["query", "--agent", "planner", "--categories", "tasks", "--user", "alice"]

    assert main([*args, *paths, "--limit", "1", "rotate the deploy key"]) == 0
    # The id first, so `history`, `update` and `delete` can take it from the listing.
    assert capsys.readouterr().out.strip() == (
        "a_deploy_key  [tasks] Alice must rotate the deploy key before the release"
    )
    assert main([*args, *paths, "--top-k", "1", "rotate the deploy key"]) == 0  # the old name
    assert capsys.readouterr().out.startswith("a_deploy_key  [tasks]")
    refused = ["query", "--agent", "planner", "--categories", "preferences", *paths, "tea"]
    assert main(refused) == 2
    assert "may not read ['preferences']" in capsys.readouterr().err
