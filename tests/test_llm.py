"""LLMClient against a real local OpenAI-compatible HTTP server (tests/openai_server.py)."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import BaseModel

from memory_dag.config import Settings
from memory_dag.llm import LLMClient, LLMConfig, LLMError
from memory_dag.memories.prompts import FactList, MemoryDecisionList
from tests.openai_server import Reply, ScriptedOpenAIServer

MESSAGES = [{"role": "user", "content": "My wife is Anne"}]


def make_client(server: ScriptedOpenAIServer, **overrides: object) -> LLMClient:
    values: dict[str, object] = {
        "base_url": server.base_url,
        "model": "test-model",
        "timeout": 5.0,
        "max_retries": 2,
        "retry_backoff": 0.0,
    }
    values.update(overrides)
    return LLMClient(LLMConfig.model_validate(values))


def test_complete_returns_text_and_sends_model_settings(
    openai_server: ScriptedOpenAIServer,
) -> None:
    openai_server.push(Reply.text("The user's wife is named Anne."))
    client = make_client(openai_server, temperature=0.0)

    answer = client.complete(MESSAGES, max_tokens=42)

    assert answer == "The user's wife is named Anne."
    body = openai_server.chat_requests[0]["body"]
    assert body["model"] == "test-model"
    assert body["messages"] == MESSAGES
    assert body["max_tokens"] == 42
    assert body["temperature"] == 0.0
    assert client.stats["calls"] == 1
    assert client.stats["failures"] == 0
    assert client.stats["completion_tokens"] > 0


def test_timeout_raises_timeout_error(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.delay(1.5, Reply.text("too late")))
    client = make_client(openai_server, timeout=0.3, max_retries=0)

    started = time.monotonic()
    with pytest.raises(LLMError) as caught:
        client.complete(MESSAGES)

    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 1.4  # gave up at the client timeout, not the reply
    assert client.stats["failures"] == 1


def test_timeout_is_retried(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.delay(1.0, Reply.text("too late")), Reply.text("in time"))
    client = make_client(openai_server, timeout=0.3, max_retries=1)

    assert client.complete(MESSAGES) == "in time"
    assert client.stats["retries"] == 1
    assert client.stats["failures"] == 0


def test_http_500_is_retried_then_raised(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.status(500), Reply.status(502), Reply.status(503))
    client = make_client(openai_server, max_retries=2)

    with pytest.raises(LLMError) as caught:
        client.complete(MESSAGES)

    assert caught.value.kind == "http"
    assert "503" in str(caught.value)
    assert len(openai_server.chat_requests) == 3
    assert client.stats["retries"] == 2
    assert client.stats["failures"] == 1


def test_http_500_then_success_recovers(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.status(500), Reply.text("recovered"))
    client = make_client(openai_server, max_retries=2)

    assert client.complete(MESSAGES) == "recovered"
    assert len(openai_server.chat_requests) == 2


def test_client_error_is_not_retried(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(
        Reply.status(400, '{"error": {"message": "model does not exist"}}'),
        Reply.text("never reached"),
    )
    client = make_client(openai_server, max_retries=2)

    with pytest.raises(LLMError, match="model does not exist") as caught:
        client.complete(MESSAGES)

    assert caught.value.kind == "http"
    assert len(openai_server.chat_requests) == 1
    assert openai_server.pending == 1


def test_unscripted_request_fails_loudly(openai_server: ScriptedOpenAIServer) -> None:
    client = make_client(openai_server, max_retries=0)

    with pytest.raises(LLMError, match="no scripted reply"):
        client.complete(MESSAGES)


def test_malformed_body_raises_malformed(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.malformed())
    client = make_client(openai_server)

    with pytest.raises(LLMError) as caught:
        client.complete(MESSAGES)

    assert caught.value.kind == "malformed"


@pytest.mark.parametrize("reply", [Reply.empty(), Reply.text("  \n ")])
def test_empty_answer_raises_empty(openai_server: ScriptedOpenAIServer, reply: Reply) -> None:
    openai_server.push(reply)
    client = make_client(openai_server)

    with pytest.raises(LLMError) as caught:
        client.complete(MESSAGES)

    assert caught.value.kind == "empty"


def test_complete_json_validates_with_schema(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(
        Reply.json(["The user's wife is named Anne.", " "]),
        Reply.json([{"id": 0, "text": "The user likes tea.", "event": "none"}]),
    )
    client = make_client(openai_server)

    facts = client.complete_json(MESSAGES, FactList)
    decisions = client.complete_json(MESSAGES, MemoryDecisionList)

    assert facts.root == ["The user's wife is named Anne."]  # the blank entry is dropped
    assert decisions.root[0].id == "0"
    assert decisions.root[0].event == "NONE"


def test_complete_json_accepts_code_fences(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.text('```json\n["The user owns a bicycle."]\n```'))
    client = make_client(openai_server)

    assert client.complete_json(MESSAGES, list[str]) == ["The user owns a bicycle."]


def test_complete_json_rejects_prose_around_json(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.push(Reply.text('Here are the facts: ["The user owns a bicycle."]'))
    client = make_client(openai_server)

    with pytest.raises(LLMError) as caught:
        client.complete_json(MESSAGES, list[str])

    assert caught.value.kind == "malformed"


def test_complete_json_schema_violation(openai_server: ScriptedOpenAIServer) -> None:
    class Insight(BaseModel):
        summary: str
        importance: int

    openai_server.push(Reply.json({"summary": "User trusts the assistant.", "importance": "high"}))
    client = make_client(openai_server)

    with pytest.raises(LLMError, match="importance") as caught:
        client.complete_json(MESSAGES, Insight)

    assert caught.value.kind == "schema"
    assert client.stats["failures"] == 1


def test_map_bounds_concurrency_and_keeps_order(openai_server: ScriptedOpenAIServer) -> None:
    def echo_slowly(body: dict) -> Reply:
        return Reply.delay(0.15, Reply.text("echo " + body["messages"][0]["content"]))

    openai_server.handler = echo_slowly
    client = make_client(openai_server, max_concurrency=2)
    items = [f"item {i}" for i in range(8)]

    answers = client.map(lambda text: client.complete([{"role": "user", "content": text}]), items)

    assert answers == [f"echo {text}" for text in items]
    assert openai_server.max_in_flight == 2  # parallel, but never more than the bound


def test_concurrency_bound_holds_across_threads(openai_server: ScriptedOpenAIServer) -> None:
    openai_server.handler = lambda body: Reply.delay(0.1, Reply.text("ok"))
    client = make_client(openai_server, max_concurrency=1)
    threads = [threading.Thread(target=client.complete, args=(MESSAGES,)) for _ in range(4)]

    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(openai_server.chat_requests) == 4
    assert openai_server.max_in_flight == 1


def test_map_reraises_first_error_and_stops(openai_server: ScriptedOpenAIServer) -> None:
    started: list[int] = []

    def work(item: int) -> int:
        started.append(item)
        if item == 1:
            raise ValueError("item 1 is broken")
        time.sleep(0.05)
        return item

    client = make_client(openai_server, max_concurrency=2)

    with pytest.raises(ValueError, match="item 1 is broken"):
        client.map(work, list(range(40)))

    assert len(started) < 40  # items not yet started were cancelled


def test_from_settings() -> None:
    assert LLMConfig.from_settings(Settings()) is None
    assert LLMConfig.from_settings(Settings(llm_base_url="http://x/v1")) is None  # no model

    config = LLMConfig.from_settings(
        Settings(llm_base_url="http://localhost:8080/v1", llm_model="qwen", llm_timeout=12.5)
    )

    assert config is not None
    assert (config.base_url, config.model, config.timeout) == (
        "http://localhost:8080/v1",
        "qwen",
        12.5,
    )


def test_models_and_embeddings_endpoints(openai_server: ScriptedOpenAIServer) -> None:
    import openai

    raw = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    openai_server.push_embedding_failure(503)

    assert [m.id for m in raw.models.list().data] == ["scripted-model"]
    with pytest.raises(openai.InternalServerError):
        raw.embeddings.create(model="e", input=["a"])
    first = raw.embeddings.create(model="e", input=["alpha", "beta"])
    again = raw.embeddings.create(model="e", input="beta")

    assert [item.index for item in first.data] == [0, 1]
    assert len(first.data[0].embedding) == openai_server.embed_dims
    assert again.data[0].embedding == first.data[1].embedding  # deterministic per text
    assert first.data[0].embedding != first.data[1].embedding
    assert sum(x * x for x in first.data[0].embedding) == pytest.approx(1.0)
