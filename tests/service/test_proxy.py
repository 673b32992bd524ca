"""The OpenAI-compatible proxy with the real `openai` client and the scripted upstream: memory
injected before the call (in scope, the current session left out), turns and facts learned
after it in the background, upstream errors passed through."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from memory_dag.service.app import ServiceConfig, create_app
from tests.openai_server import Reply
from tests.service.conftest import ALICE, BOB, Served, ok
from tests.service.server import running

#: How long a test waits for the background step (learning) that follows a response.
BACKGROUND_WAIT = 60.0


def _client(served: Served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0)


def _ask(
    served: Served, key: str, text: str, *, conversation: str = "trip", session: str | None = None
) -> Any:
    headers = {"X-Memory-Conversation": conversation}
    if session is not None:
        headers["X-Memory-Session"] = session
    return _client(served, key).chat.completions.create(
        model="scripted-model",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        extra_headers=headers,
    )


def _injected(served: Served) -> str:
    """The memory block the upstream received with the last request ('' when none)."""
    messages = served.upstream.chat_requests[-1]["body"]["messages"]
    notes = [m["content"] for m in messages if m["content"].startswith("Memory (memory-dag)")]
    assert [m["role"] for m in messages][-1] == "user"
    return "\n".join(notes)


def _wait_for(condition: Any) -> Any:
    deadline = time.monotonic() + BACKGROUND_WAIT
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("the background step did not happen")


def _search(served: Served, user: str, query: str, **scope: Any) -> list[str]:
    found = served.memory.search(
        query, user_id=user, conversation_id="trip", min_score=0.0, **scope
    )
    return [r.memory for r in found.results]


def test_memory_in_answer_out_and_facts_learned(served: Served) -> None:
    served.memory.add("Alice prefers window seats", user_id="alice", conversation_id="trip",
                      category="preferences")  # fmt: skip
    served.memory.add("Bob prefers aisle seats", user_id="bob", conversation_id="trip",
                      category="preferences")  # fmt: skip
    served.upstream.push(Reply.text("A window seat, then."))
    answer = _ask(served, ALICE, "Which seat should I book? I moved to Lisbon last month.")
    assert answer.choices[0].message.content == "A window seat, then."
    block = _injected(served)
    assert "window seats" in block
    assert "aisle" not in block  # bob's memory is never injected for alice
    messages = served.upstream.chat_requests[-1]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user"]  # after her own

    learned = _wait_for(lambda: [t for t in _search(served, "alice", "Lisbon") if "moved" in t])
    assert any("Lisbon" in text for text in learned)
    _wait_for(lambda: "A window seat, then." in " ".join(_search(served, "alice", "window seat")))
    # Her turns are shared by the conversation (scope.py); the facts drawn from them are hers.
    hers = served.memory.search("Lisbon", user_id="alice", conversation_id="trip", min_score=0)
    facts = {r.id for r in hers.results if r.user_id == "alice"}
    his = served.memory.search("Lisbon", user_id="bob", conversation_id="trip", min_score=0)
    assert len(facts) == 2 and not facts & {r.id for r in his.results}


def test_the_current_session_is_left_out_and_a_new_one_sees_it(served: Served) -> None:
    served.upstream.push(Reply.text("Noted."), Reply.text("Teal."), Reply.text("Teal!"))
    _ask(served, ALICE, "My favourite colour is teal.", session="s-1")
    _wait_for(lambda: [t for t in _search(served, "alice", "favourite colour teal") if "teal" in t])
    _ask(served, ALICE, "What is my favourite colour?", session="s-1")
    assert "teal" not in _injected(served).lower()  # said in this session: already in the prompt
    _ask(served, ALICE, "What is my favourite colour?", session="s-2")
    assert "teal" in _injected(served).lower()
    # Bob, in the same conversation, heard her turns (shared), but is never told her fact.
    served.upstream.push(Reply.text("No idea."))
    _ask(served, BOB, "What is Alice's favourite colour?", session="s-3")
    told = [line for line in _injected(served).lower().splitlines() if "teal" in line]
    assert told and all(line.startswith(("[user]", "[assistant]")) for line in told), told


def test_a_streamed_answer_is_relayed_and_learned(served: Served) -> None:
    served.upstream.push(Reply.text("Pack light for Kyoto in April."))
    stream = _client(served, ALICE).chat.completions.create(
        model="scripted-model",
        messages=[{"role": "user", "content": "I am planning a trip to Kyoto."}],
        stream=True,
        extra_headers={"X-Memory-Conversation": "trip", "X-Memory-Session": "s-9"},
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len(pieces) > 3  # relayed chunk by chunk
    assert "".join(pieces) == "Pack light for Kyoto in April."
    transcript = served.root / "workspace" / "sessions" / "trip" / "s-9.jsonl"
    _wait_for(lambda: "Pack light for Kyoto" in " ".join(_search(served, "alice", "Kyoto packing")))
    assert "Pack light for Kyoto in April." in transcript.read_text()


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_come_back_with_their_status_and_body(served: Served, stream: bool) -> None:
    served.upstream.push(Reply.status(500, '{"error": {"message": "the model is on fire"}}'))
    with pytest.raises(openai.InternalServerError) as failure:
        _client(served, ALICE).chat.completions.create(
            model="scripted-model", messages=[{"role": "user", "content": "hello"}], stream=stream
        )
    assert failure.value.status_code == 500
    assert "the model is on fire" in str(failure.value)
    served.upstream.push(Reply.status(429, '{"error": {"message": "slow down"}}'))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        _ask(served, ALICE, "hello again")
    time.sleep(0.2)
    assert _search(served, "alice", "hello") == []  # nothing learned from a failed call


def test_a_slow_or_malformed_upstream_is_a_clear_gateway_error(served: Served) -> None:
    served.upstream.push(Reply.delay(5, Reply.text("too late")))
    with pytest.raises(openai.APIStatusError) as slow:
        _ask(served, ALICE, "are you there?")
    assert slow.value.status_code == 504
    served.upstream.push(Reply.malformed())
    with pytest.raises(openai.APIStatusError) as broken:
        _ask(served, ALICE, "are you there?")
    assert broken.value.status_code == 502
    assert "not a chat completion" in str(broken.value)


def test_models_pass_through_and_bad_requests_are_400(served: Served) -> None:
    models = _client(served, ALICE).models.list()
    assert [m.id for m in models.data] == ["scripted-model"]
    client = served.client(ALICE)
    assert client.post("/v1/chat/completions", content=b"nope").status_code == 400
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    crafted = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "bob"},
    )
    assert crafted.status_code == 403  # the key acts for alice only
    traversal = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Memory-Conversation": "../../etc"},
    )
    assert traversal.status_code == 400
    assert served.upstream.chat_requests == []  # none of these reached the upstream
    assert served.client(None).post("/v1/chat/completions", json={}).status_code == 401


def test_without_an_upstream_the_proxy_says_so(served: Served, tmp_path: Any) -> None:
    with running(create_app(served.memory, ServiceConfig())) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as failure:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert failure.value.status_code == 503
        assert "MEMORY_DAG_UPSTREAM_BASE_URL" in str(failure.value)
    assert ok(served.client(ALICE).get("/health"))["status"] == "ok"
