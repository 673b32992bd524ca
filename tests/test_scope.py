"""The scope boundary (memory_dag/scope.py): one place decides what a request may read and
write, every path uses it, and a scoped store asked without a user fails closed.

Issue 13 items 1-3: the delta header used to ignore the allowlist, the user and the procedural
exclusion; `remember` deduplicated across users; unknown categories were accepted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_dag.cli.main import main
from memory_dag.config import Settings
from memory_dag.index.search import search
from memory_dag.maintenance.procedures import remember_procedure
from memory_dag.memories.agent_ops import correct, forget, remember
from memory_dag.memories.categories import AccessDenied
from memory_dag.memories.change_log import changes
from memory_dag.memories.lookups import entity_profile, memory_history
from memory_dag.pipeline import run_all
from memory_dag.read.context_block import build_context
from memory_dag.read.query import MemoryQuery, query_memory
from memory_dag.read.retriever import RetrievalConfig
from memory_dag.scope import Scope, ScopeRequired, UnknownCategory, owner_key
from memory_dag.summaries.export import export_store
from tests.conftest import write_jsonl
from tests.memories.test_write_path import store_settings, turn

QUIET = RetrievalConfig(store_signals=False, track_access=False)


def alice(**fields: object) -> Scope:
    return Scope.of(user_id="alice", conversation_id="demo", **fields)  # type: ignore[arg-type]


def bob(**fields: object) -> Scope:
    return Scope.of(user_id="bob", conversation_id="demo", **fields)  # type: ignore[arg-type]


#: The memories `shared` remembers in conversation `demo`: key -> (user, text).
MEMORIES = {
    "alice_tea": ("alice", "Alice prefers green tea."),
    "alice_goal": ("alice", "Alice plans to ship the harbor demo in May."),
    "bob_food": ("bob", "Bob prefers spicy food at team lunches."),
    "bob_profile": ("bob", "Bob is allergic to peanuts."),
    "alice_profile": ("alice", "Alice is allergic to shellfish."),
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, dict[str, str]]:
    """Conversation `demo` with a transcript, memories of alice and bob, and a procedure."""
    root = tmp_path_factory.mktemp("scope-store")
    settings = store_settings(root, root / "workspace")
    write_jsonl(
        settings.workspace / "sessions" / "demo" / "s1.jsonl",
        [turn("t1", "We should plan the harbor demo together.", "2026-11-01T10:00:00Z")],
    )
    run_all(settings)
    ids = {
        key: remember(
            settings, text, scope=Scope.of(user_id=user, conversation_id="demo"), refresh=False
        ).memory_id
        for key, (user, text) in MEMORIES.items()
    }
    ids["alice_steps"] = remember_procedure(
        settings,
        ["Open the harbor dashboard.", "Run the demo script."],
        title="Harbor demo",
        conversation_id="demo",
        user_id="alice",
    )
    return settings, ids


def header_lines(settings: Settings, scope: Scope) -> list[str]:
    block = build_context("what should we plan?", scope, settings=settings, config=QUIET)
    lines = block.text.splitlines()
    return [line for line in lines if line.startswith("- ")]


# --- item 1: the delta header follows the same scope as the memories ------------------------


def test_the_delta_header_shows_only_the_users_memories(shared) -> None:
    settings, _ = shared
    for line in header_lines(settings, alice(agent="planner")):
        assert "Bob" not in line
    for line in header_lines(settings, bob(agent="supervisor")):
        assert "Alice" not in line


def test_the_delta_header_respects_the_agents_allowlist_and_leaves_procedures_out(
    shared,
) -> None:
    settings, _ = shared
    stylist = header_lines(settings, alice(agent="stylist"))
    assert not [line for line in stylist if "[profile]" in line or "[goals]" in line]
    planner = header_lines(settings, alice(agent="planner"))
    assert not [line for line in planner if "Open the harbor dashboard" in line]
    assert not [line for line in planner if "[preferences]" in line]


def test_changes_are_scoped_like_the_header(shared) -> None:
    settings, ids = shared
    seen = {row["memory_id"] for row in changes(settings, 0, scope=alice()).changes}
    assert ids["alice_tea"] in seen and ids["bob_food"] not in seen
    with pytest.raises(ScopeRequired):
        changes(settings, 0, scope=Scope.of(conversation_id="demo"))


def test_context_and_query_agree_on_what_a_planner_of_alice_may_read(shared) -> None:
    settings, ids = shared
    block = build_context(
        "harbor demo plan", alice(agent="planner"), settings=settings, config=QUIET,
        min_score=0.0, max_memories=10,
    )  # fmt: skip
    response = query_memory(
        MemoryQuery(agent="planner", query="harbor demo plan", top_k=10, threshold=0.0),
        scope=Scope.of(user_id="alice"),
        settings=settings,
        config=QUIET,
    )
    assert [r.id for r in response.results] == [ids["alice_goal"]]
    assert "Alice plans to ship the harbor demo in May." in block.text
    for text in ("Bob", "green tea", "shellfish", "Open the harbor dashboard"):
        assert text not in block.text


# --- the rule: a scoped store asked without a user fails closed --------------------------------


def test_a_scoped_store_refuses_reads_without_a_user(shared, tmp_path: Path) -> None:
    settings, ids = shared
    with pytest.raises(ScopeRequired):
        build_context("tea", Scope.of(conversation_id="demo"), settings=settings, config=QUIET)
    with pytest.raises(ScopeRequired):
        query_memory(MemoryQuery(agent="supervisor", query="tea"), settings=settings, config=QUIET)
    with pytest.raises(ScopeRequired):
        search("tea", settings=settings)
    with pytest.raises(ScopeRequired):
        export_store(settings, tmp_path / "export")
    with pytest.raises(ScopeRequired):
        entity_profile(settings, "Alice")
    with pytest.raises(ScopeRequired):
        memory_history(settings, ids["alice_tea"])
    with pytest.raises(ScopeRequired):
        remember(settings, "Somebody likes tea.", scope=Scope.of(conversation_id="demo"))


def test_a_user_never_reads_or_writes_another_users_memories(shared, tmp_path: Path) -> None:
    settings, ids = shared
    hits = search("food tea peanuts", settings=settings, scope=alice(), k=50)
    assert {h.id for h in hits}.isdisjoint({ids["bob_food"], ids["bob_profile"]})
    with pytest.raises(AccessDenied):
        memory_history(settings, ids["bob_food"], scope=alice())
    with pytest.raises(AccessDenied):
        correct(settings, ids["bob_food"], "Bob prefers mild food.", scope=alice())
    with pytest.raises(AccessDenied):
        forget(settings, ids["bob_food"], scope=alice())
    profile = entity_profile(settings, "Bob", scope=alice())
    assert all(m["id"] not in (ids["bob_food"], ids["bob_profile"]) for p in profile
               for m in p["memories"])  # fmt: skip
    report = export_store(settings, tmp_path / "alice", facts=True, scope=alice())
    exported = "\n".join(p.read_text() for p in (tmp_path / "alice").rglob("*.md"))
    assert report.written and "Alice prefers green tea." in exported
    assert "Bob" not in exported


def test_an_agent_may_not_change_memories_outside_its_allowlist(shared) -> None:
    settings, ids = shared
    with pytest.raises(AccessDenied):
        forget(settings, ids["alice_tea"], scope=alice(agent="planner"))


def test_a_store_of_one_user_may_be_read_without_a_user(tmp_path: Path) -> None:
    settings = Settings(
        workspace=tmp_path / "ws", db_path=tmp_path / "m.duckdb", index_dir=tmp_path / "ix"
    )
    (tmp_path / "ws").mkdir()
    remember(settings, "Dana prefers oat milk.", scope=Scope.of(user_id="dana"))
    hits = search("oat milk", settings=settings)
    assert [h.snippet for h in hits] == ["Dana prefers oat milk."]


# --- item 2: remember deduplicates per user, never across users -------------------------------


def test_remember_of_the_same_text_by_two_users_stores_two_memories(tmp_path: Path) -> None:
    settings = Settings(
        workspace=tmp_path / "ws", db_path=tmp_path / "m.duckdb", index_dir=tmp_path / "ix"
    )
    (tmp_path / "ws").mkdir()
    first = remember(settings, "The user likes pizza", scope=alice(), refresh=False)
    second = remember(settings, "The user likes pizza", scope=bob(), refresh=False)
    again = remember(settings, "the user likes pizza.", scope=alice(), refresh=False)
    elsewhere = remember(
        settings, "The user likes pizza", scope=Scope.of(user_id="alice", conversation_id="other"),
        refresh=False,
    )  # fmt: skip

    assert (first.status, second.status) == ("created", "created")
    assert second.memory_id != first.memory_id
    assert (again.status, again.memory_id) == ("duplicate", first.memory_id)
    assert (elsewhere.status, elsewhere.memory_id) == ("duplicate", first.memory_id)
    history = memory_history(settings, second.memory_id, scope=bob())
    assert history["memory"]["user_id"] == "bob"


def test_owner_keys_group_by_user_before_conversation() -> None:
    assert owner_key("alice", "demo") == owner_key("alice", None) == "user:alice"
    assert owner_key(None, "demo") == "conversation:demo"
    assert owner_key(None, None) == "conversation:"


# --- item 3: unknown categories are rejected at write time, with the known ones ------------------


def test_remember_rejects_an_unknown_category_and_names_the_known_ones(tmp_path: Path) -> None:
    settings = Settings(
        workspace=tmp_path / "ws", db_path=tmp_path / "m.duckdb", index_dir=tmp_path / "ix"
    )
    (tmp_path / "ws").mkdir()
    with pytest.raises(UnknownCategory) as refused:
        remember(settings, "Sam knows the vault code.", category="topsecret", refresh=False)
    message = str(refused.value)
    assert "'topsecret'" in message and "preferences" in message and "profile" in message
    assert not settings.db_path.exists() or changes(settings, 0).changes == []


# --- scope objects -----------------------------------------------------------------------------


def test_a_scope_resolves_the_allowlist_and_refuses_what_it_does_not_allow() -> None:
    planner = Scope.of(agent="planner", user_id="alice")
    assert planner.categories == frozenset({"goals", "tasks", "projects"})
    assert not planner.procedural
    assert Scope.of(agent="planner", categories=["procedural"]).procedural
    with pytest.raises(AccessDenied, match="may not read"):
        Scope.of(agent="planner", categories=["preferences"])
    with pytest.raises(AccessDenied, match="unknown agent"):
        Scope.of(agent="intruder")


@pytest.mark.parametrize(
    "row, readable",
    [
        ({"kind": "fact", "user_id": "alice", "conversation_id": "demo", "category": "goals"},
         True),
        ({"kind": "fact", "user_id": "bob", "conversation_id": "demo", "category": "goals"},
         False),
        ({"kind": "fact", "user_id": None, "conversation_id": "demo", "category": "tasks"}, True),
        ({"kind": "fact", "user_id": None, "conversation_id": "other", "category": "tasks"},
         False),
        ({"kind": "fact", "user_id": "alice", "conversation_id": "demo",
          "category": "preferences"}, False),
        ({"kind": "procedural", "user_id": "alice", "conversation_id": "demo",
          "category": "procedural"}, False),
        ({"kind": "episode", "user_id": "bob", "conversation_id": "demo", "category": None},
         False),  # a turn is shared, but read as `event`, which the planner may not read
        ({"kind": "summary", "user_id": None, "conversation_id": "demo",
          "attributes": '{"source_categories": ["goals"]}'}, True),
        ({"kind": "summary", "user_id": None, "conversation_id": "demo",
          "attributes": '{"source_categories": ["goals", "event"]}'}, False),
        ({"kind": "reflection", "user_id": "alice", "conversation_id": None,
          "attributes": None}, False),  # sources unknown: fail closed
    ],
)  # fmt: skip
def test_allows_follows_ownership_conversation_and_categories(
    row: dict[str, object], readable: bool
) -> None:
    assert alice(agent="planner").allows(row) is readable


def test_without_a_conversation_a_user_reads_only_own_memories() -> None:
    scope = Scope.of(user_id="alice")
    assert scope.allows({"kind": "fact", "user_id": "alice", "conversation_id": "x"})
    assert not scope.allows({"kind": "fact", "user_id": None, "conversation_id": "x"})
    assert not scope.allows({"kind": "episode", "user_id": "alice", "conversation_id": "x"})


# --- the command line acts for --user / --agent -----------------------------------------------


def test_the_cli_refuses_a_scoped_store_without_a_user_and_serves_one_with_it(
    shared, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, _ = shared
    where = ["--db", str(settings.db_path), "--index-dir", str(settings.index_dir)]
    refused = [
        ["context", "what should we plan?", "--conversation", "demo"],
        ["search", "tea"],
        ["changes", "--conversation", "demo"],
        ["export", str(tmp_path / "out")],
        ["query", "--agent", "supervisor", "tea"],
        ["remember", "Somebody likes tea.", "--conversation", "demo"],
    ]
    for command in refused:
        assert main([*command, *where]) == 2, command
        assert "rejected" in capsys.readouterr().err

    assert main(["context", "plan", "--conversation", "demo", "--user", "alice", *where]) == 0
    out = capsys.readouterr().out
    assert "Alice" in out and "Bob" not in out
    assert main(["changes", "--conversation", "demo", "--user", "bob", *where]) == 0
    out = capsys.readouterr().out
    assert "Bob" in out and "Alice" not in out
    unknown = ["remember", "Bob keeps a vault code.", "--user", "bob", "--category", "topsecret"]
    assert main([*unknown, *where]) == 2
    assert "known categories" in capsys.readouterr().err
