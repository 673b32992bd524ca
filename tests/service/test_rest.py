"""The REST API on a real server: the write side, reads, identity, isolation, bad requests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from memory_dag.memory import Memory
from memory_dag.service.app import ServiceConfig, create_app
from memory_dag.service.identity import ServiceConfigError, check_bind
from tests.service.conftest import ALICE, BOB, PLANNER, STYLIST, Served, ok
from tests.service.server import running

REPO_ROOT = Path(__file__).resolve().parents[2]


def _remember(served: Served, key: str, text: str, **fields: object) -> str:
    body = {"text": text, "conversation_id": "trip", **fields}
    added = ok(served.client(key).post("/v1/memories", json=body), 201)
    assert added["results"][0]["event"] == "ADD", added
    return added["results"][0]["id"]


def _search_ids(served: Served, key: str, query: str, **fields: object) -> list[str]:
    body = {"query": query, "conversation_id": "trip", "min_score": 0.0, **fields}
    return [
        r["id"] for r in ok(served.client(key).post("/v1/memories/search", json=body))["results"]
    ]


def test_the_write_side_over_rest(served: Served) -> None:
    alice = served.client(ALICE)
    memory_id = _remember(served, ALICE, "Alice is allergic to peanuts", category="profile")
    # Searchable, listable and readable the moment the write returned.
    assert _search_ids(served, ALICE, "peanut allergy")[0] == memory_id
    listed = ok(alice.get("/v1/memories", params={"conversation_id": "trip"}))["results"]
    assert [m["id"] for m in listed] == [memory_id]
    item = ok(alice.get(f"/v1/memories/{memory_id}"))
    assert (item["memory"], item["user_id"], item["agent_id"]) == (
        "Alice is allergic to peanuts",
        "alice",
        "supervisor",
    )

    changed = ok(
        alice.put(f"/v1/memories/{memory_id}", json={"text": "Alice is allergic to hazelnuts"})
    )
    assert (changed["status"], changed["replaced_id"]) == ("updated", memory_id)
    new_id = changed["id"]
    assert new_id != memory_id
    assert _search_ids(served, ALICE, "allergic")[0] == new_id
    assert memory_id not in _search_ids(served, ALICE, "allergic")
    trail = ok(alice.get(f"/v1/memories/{new_id}/history"))
    assert [(e["event"], e["old_ref"], e["new_ref"]) for e in trail["events"]] == [
        ("UPDATE", memory_id, new_id)
    ]

    assert ok(alice.delete(f"/v1/memories/{new_id}"))["status"] == "forgotten"
    assert new_id not in _search_ids(served, ALICE, "allergic")
    assert ok(alice.get("/v1/memories", params={"conversation_id": "trip"}))["results"] == []
    assert ok(alice.get(f"/v1/memories/{new_id}"))["state"] == "soft_deleted"
    assert ok(alice.post(f"/v1/memories/{new_id}/restore"))["status"] == "restored"
    assert _search_ids(served, ALICE, "allergic")[0] == new_id
    # A second forget of a forgotten memory is a clear 4xx, and changes nothing.
    alice.delete(f"/v1/memories/{new_id}")
    again = alice.delete(f"/v1/memories/{new_id}")
    assert again.status_code == 400 and "not active" in again.json()["error"]["message"]


def test_messages_are_recorded_and_their_facts_learned(served: Served) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "I moved to Lisbon last month."},
            {"role": "assistant", "content": "Lisbon is lovely!"},
        ],
        "conversation_id": "trip",
        "run_id": "s-1",
    }
    added = ok(served.client(ALICE).post("/v1/memories", json=body), 201)
    assert len(added["turns"]) == 2  # the system message is not a memory
    assert added["run_id"] == "s-1"
    facts = [r for r in added["results"] if r["event"] == "ADD"]
    assert facts and "Lisbon" in facts[0]["memory"]
    found = _search_ids(served, ALICE, "where does Alice live now", run_id="s-1")
    assert facts[0]["id"] in found and set(added["turns"]) & set(found)
    transcript = served.root / "workspace" / "sessions" / "trip" / "s-1.jsonl"
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [(line["role"], line["content"]) for line in lines] == [
        ("user", "I moved to Lisbon last month."),
        ("assistant", "Lisbon is lovely!"),
    ]


def test_a_write_is_searchable_from_another_process_at_once(served: Served) -> None:
    memory_id = _remember(served, ALICE, "Alice keeps her passport in the blue drawer")
    script = textwrap.dedent(
        f"""
        from memory_dag import Memory
        found = Memory(path={str(served.root)!r}).search(
            "where is the passport", user_id="alice", conversation_id="trip")
        print(found.results[0].id if found.results else "")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == memory_id


# --- isolation probes ----------------------------------------------------------------------


def test_one_user_never_reaches_another_users_memory(served: Served) -> None:
    secret = _remember(served, ALICE, "Alice's door code is 4711", category="profile")
    _remember(served, BOB, "Bob likes sailing", category="preferences")
    bob = served.client(BOB)

    assert secret not in _search_ids(served, BOB, "door code 4711")
    for path in (f"/v1/memories/{secret}", f"/v1/memories/{secret}/history"):
        assert bob.get(path).status_code in (403, 404), path
    listed = ok(bob.get("/v1/memories", params={"conversation_id": "trip"}))["results"]
    assert secret not in [m["id"] for m in listed]
    # Writes to her memory are refused and change nothing.
    assert (
        bob.put(f"/v1/memories/{secret}", json={"text": "Alice's code is 0000"}).status_code == 403
    )
    assert bob.delete(f"/v1/memories/{secret}").status_code == 403
    assert secret in _search_ids(served, ALICE, "door code 4711")
    # A key bound to bob cannot act for alice by naming her, in any field or case.
    for user in ("alice", "Alice", "ALICE"):
        named = bob.post("/v1/memories/search", json={"query": "door code", "user_id": user})
        assert named.status_code == 403, user
    crafted = bob.post(
        "/v1/memories/search", json={"query": "door code", "filters": {"user_id": "alice"}}
    )
    assert crafted.status_code == 403
    assert bob.get("/v1/users/alice/export").status_code == 403
    assert bob.get("/v1/memories", params={"user_id": "alice"}).status_code == 403
    context = ok(bob.post("/v1/context", json={"query": "door code", "conversation_id": "trip"}))
    assert "4711" not in context["text"]
    query = ok(bob.post("/v1/query", json={"query": "door code", "min_score": 0.0}))
    assert "4711" not in json.dumps(query)
    # A key bound to no user must name one in a store of several users.
    planner = served.client(PLANNER)
    refused = planner.post("/v1/memories/search", json={"query": "door code"})
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "scope_required"


def test_an_agent_never_reads_outside_its_allowlist(served: Served) -> None:
    _remember(served, ALICE, "Alice lives in Lisbon", category="profile")
    liked = _remember(served, ALICE, "Alice prefers a calm tone", category="preferences")
    stylist = served.client(STYLIST)

    readable = _search_ids(served, STYLIST, "Alice")
    assert readable == [liked]  # the stylist reads preferences, not profile
    context = ok(stylist.post("/v1/context", json={"query": "Alice", "conversation_id": "trip"}))
    assert "Lisbon" not in context["text"]
    query = ok(stylist.post("/v1/query", json={"query": "where does Alice live", "min_score": 0}))
    assert "Lisbon" not in json.dumps(query)
    # Crafted categories: outside the allowlist, case variants, an empty list.
    for categories in (["profile"], ["Profile"], ["PREFERENCES", "profile"]):
        denied = stylist.post("/v1/query", json={"query": "Alice", "categories": categories})
        assert denied.status_code == 403, categories
    empty = stylist.post("/v1/query", json={"query": "Alice", "categories": [], "min_score": 0})
    assert empty.status_code == 403 or "Lisbon" not in empty.text
    for filters in ({"category": "profile"}, {"category": ["preferences", "profile"]}):
        crafted = stylist.post("/v1/memories/search", json={"query": "Alice", "filters": filters})
        assert crafted.status_code == 403, filters
    # Writing into a category the agent may not read is refused too.
    written = stylist.post("/v1/memories", json={"text": "Alice is 40", "category": "profile"})
    assert written.status_code in (400, 403)
    assert "Alice is 40" not in json.dumps(ok(served.client(ALICE).get("/v1/memories")))


def test_export_is_one_users_memories_and_history(served: Served) -> None:
    first = _remember(served, ALICE, "Alice collects stamps", category="preferences")
    changed = ok(
        served.client(ALICE).put(f"/v1/memories/{first}", json={"text": "Alice collects coins"})
    )
    _remember(served, BOB, "Bob collects shells", category="preferences")
    answer = served.client(ALICE).get("/v1/users/alice/export")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    memories = {line["id"]: line for line in lines if line["type"] == "memory"}
    assert set(memories) == {first, changed["id"]}
    assert "Bob" not in answer.text
    assert any(line["type"] == "history" and line["event"] == "UPDATE" for line in lines)


# --- identity and bad requests --------------------------------------------------------------


def test_keys_are_required_and_bad_requests_say_what_is_wrong(served: Served) -> None:
    assert served.client(None).post("/v1/memories/search", json={"query": "x"}).status_code == 401
    wrong = served.client("not-a-key-at-all").get("/v1/memories")
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
    assert served.client(None).get("/docs").status_code == 200  # the docs stay readable
    alice = served.client(ALICE)
    both = alice.post("/v1/memories", json={"text": "x", "messages": []})
    assert both.status_code == 422 and "exactly one" in both.json()["error"]["message"]
    unknown = alice.post("/v1/memories/search", json={"query": "x", "top_k": 3})
    assert unknown.status_code == 422 and "top_k" in unknown.json()["error"]["message"]
    broken = alice.post(
        "/v1/memories", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422
    assert alice.post("/v1/memories", json={"text": "   "}).status_code == 400
    assert alice.get("/v1/memories/fact_does_not_exist").status_code == 404
    bad_run = alice.post("/v1/memories", json={"messages": [{"role": "user", "content": "hi"}],
                                               "run_id": "../../etc/passwd"})  # fmt: skip
    assert bad_run.status_code == 400
    assert ok(alice.get("/v1/memories"))["results"] == []  # nothing was half-written


def test_a_body_over_the_limit_is_refused_before_anything_is_written(served: Served) -> None:
    alice = served.client(ALICE)
    huge = {"messages": [{"role": "user", "content": "word " * 20_000}], "conversation_id": "t"}
    refused = alice.post("/v1/memories", json=huge)
    assert refused.status_code == 413
    assert refused.json()["error"]["type"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it streams
        yield b'{"text": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    streamed = alice.post(
        "/v1/memories", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    assert not (served.root / "workspace" / "sessions").exists()
    assert ok(alice.get("/v1/memories"))["results"] == []


def test_no_open_server_on_a_public_address(tmp_path: Path) -> None:
    with pytest.raises(ServiceConfigError, match="without API keys"):
        check_bind("0.0.0.0", None)
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    done = subprocess.run(
        [sys.executable, "-m", "memory_dag.cli.main", "serve", "--host", "0.0.0.0",
         "--workspace", str(tmp_path / "w"), "--db", str(tmp_path / "m.duckdb")],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 without API keys" in done.stderr


def test_a_key_file_naming_an_unknown_agent_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("keys:\n  key-for-nobody: {agent: nobody}\n", encoding="utf-8")
    with pytest.raises(ServiceConfigError, match="nobody"):
        create_app(config=ServiceConfig(api_keys_file=bad))


def test_open_on_loopback_acts_as_the_configured_identity(tmp_path: Path) -> None:
    config = ServiceConfig(open_agent="stylist", open_user="alice")
    memory = Memory(path=tmp_path / "store")
    memory.add("Alice lives in Porto", user_id="alice", category="profile", conversation_id="c")
    with running(create_app(memory, config)) as url, httpx.Client(base_url=url) as client:
        asked = {"query": "Alice Porto", "conversation_id": "c"}
        found = ok(client.post("/v1/memories/search", json=asked))
        assert found["results"] == []  # the stylist may not read profile
        other = {"query": "x", "user_id": "bob"}
        assert client.post("/v1/memories/search", json=other).status_code == 403
