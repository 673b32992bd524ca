"""The OpenAI-compatible proxy (seed 000 §1.1, §3, §4): memory before the call, facts after.

`POST /v1/chat/completions`, streaming or not, forwarded to `MEMORY_DAG_UPSTREAM_BASE_URL`:

1. the caller: the key's agent; the key's user, else the request's `user` field; the
   conversation from `X-Memory-Conversation` (default "default"), the session from
   `X-Memory-Session`, else the conversation's current one (a new one after
   `idle_seconds` without a turn, which closes the previous one, seed 004);
2. the context block for the last user message (`Memory.context`, seed 000 §3's order: delta
   header, summary, memories, related, reflection; the current session left out, seed 004) is
   added as a system message after the request's own;
3. the request goes upstream (its key: `MEMORY_DAG_UPSTREAM_API_KEY`, else the caller's
   `Authorization` unless that carried a memory-dag key); an upstream error comes back with
   the upstream's status and body, a timeout as 504, an unreachable or malformed upstream 502;
4. after the answer (or the stream's last chunk) the user turn and the assistant's answer are
   recorded and the user turn's facts extracted (`Memory.add`) by the service's learner
   (`learner.py`: one thread, turns in the order answered, off the request's cycle): neither
   the response nor the next request on the connection waits for it.

`GET /v1/models` is passed through.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from memory_dag.ids import check_path_id
from memory_dag.memories.transcripts import check_session_id
from memory_dag.service.app import Service, error, identity_of, service_of

router = APIRouter(tags=["proxy"])
log = logging.getLogger("memory_dag.service.proxy")

CONVERSATION_HEADER = "x-memory-conversation"
SESSION_HEADER = "x-memory-session"
DEFAULT_CONVERSATION = "default"
#: Headers of the upstream's answer that are passed back.
PASSED_HEADERS = ("content-type",)


def _upstream(service: Service, path: str, request: Request) -> tuple[str, dict[str, str]]:
    """The upstream URL of `path` and the headers to send it."""
    base = (service.config.upstream_base_url or "").rstrip("/")
    headers = {"content-type": "application/json"}
    identity = identity_of(request)
    if service.config.upstream_api_key:
        headers["authorization"] = f"Bearer {service.config.upstream_api_key}"
    elif request.headers.get("authorization") and not identity.via_authorization:
        headers["authorization"] = request.headers["authorization"]
    return f"{base}{path}", headers


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The upstream's models, as it answers."""
    service = service_of(request)
    if not service.config.upstream_base_url or service.upstream is None:
        return _no_upstream()
    url, headers = _upstream(service, "/models", request)
    try:
        answer = await service.upstream.get(url, headers=headers)
    except httpx.TimeoutException:
        return error(504, "upstream_timeout", "the upstream did not answer in time")
    except httpx.HTTPError as failure:
        return error(502, "upstream_unreachable", f"the upstream failed: {failure}")
    return _passed(answer)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completions, with the caller's memory injected and its turns learned."""
    service = service_of(request)
    if not service.config.upstream_base_url or service.upstream is None:
        return _no_upstream()
    body = await _json_body(request)
    if isinstance(body, Response):
        return body
    turn = _Turn.of(request, body, service)
    if isinstance(turn, Response):
        return turn
    if turn.message is not None:
        with service.learner.busy():
            block = await run_in_threadpool(turn.context, service)
        if block:
            body["messages"] = _with_context(body["messages"], block)
    url, headers = _upstream(service, "/chat/completions", request)
    if body.get("stream"):
        return await _streamed(service, url, headers, body, turn)
    try:
        answer = await service.upstream.post(url, headers=headers, json=body)
    except httpx.TimeoutException:
        return error(504, "upstream_timeout", "the upstream did not answer in time")
    except httpx.HTTPError as failure:
        return error(502, "upstream_unreachable", f"the upstream failed: {failure}")
    if answer.status_code >= 400:
        return _passed(answer)
    try:
        completion = answer.json()
        reply = completion["choices"][0]["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return error(502, "upstream_malformed", "the upstream's answer is not a chat completion")
    return JSONResponse(
        completion,
        background=BackgroundTask(_learn_later, service, lambda: turn.learn(service, reply)),
    )


async def _streamed(
    service: Service, url: str, headers: dict[str, str], body: dict[str, Any], turn: _Turn
) -> Response:
    """Relay the upstream's event stream chunk by chunk; learn once it has ended."""
    assert service.upstream is not None
    upstream = service.upstream.build_request("POST", url, headers=headers, json=body)
    try:
        answer = await service.upstream.send(upstream, stream=True)
    except httpx.TimeoutException:
        return error(504, "upstream_timeout", "the upstream did not answer in time")
    except httpx.HTTPError as failure:
        return error(502, "upstream_unreachable", f"the upstream failed: {failure}")
    if answer.status_code >= 400:
        await answer.aread()
        await answer.aclose()
        return _passed(answer)
    said: list[str] = []

    async def relay() -> AsyncIterator[bytes]:
        pending = b""
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
                pending += chunk
                *lines, pending = pending.split(b"\n")
                said.extend(_deltas(lines))
            said.extend(_deltas([pending]))
        finally:
            await answer.aclose()

    def learn_all() -> None:
        turn.learn(service, "".join(said))

    return StreamingResponse(
        relay(),
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type", "text/event-stream"),
        background=BackgroundTask(_learn_later, service, learn_all),
    )


async def _learn_later(service: Service, job: Callable[[], None]) -> None:
    """Hand `job` to the learner once the answer is sent (async: no thread hop to enqueue)."""
    service.learner.submit(job)


def _deltas(lines: list[bytes]) -> list[str]:
    """The text of the content deltas in server-sent event lines."""
    texts: list[str] = []
    for line in lines:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            chunk = json.loads(data)
            text = chunk["choices"][0]["delta"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if isinstance(text, str):
            texts.append(text)
    return texts


class _Turn:
    """Who says what in one proxied call, and what to learn from it afterwards."""

    def __init__(
        self,
        user_id: str | None,
        agent_id: str | None,
        conversation_id: str,
        run_id: str,
        message: str | None,
    ) -> None:
        self.user_id = user_id
        self.agent_id = agent_id
        self.conversation_id = conversation_id
        self.run_id = run_id
        self.message = message

    @classmethod
    def of(cls, request: Request, body: dict[str, Any], service: Service) -> _Turn | Response:
        identity = identity_of(request)
        requested = body.get("user")
        if requested is not None and not isinstance(requested, str):
            return error(400, "invalid_request", "`user` must be a string")
        user_id = identity.user(requested)  # AccessDenied for another user: 403
        conversation = request.headers.get(CONVERSATION_HEADER) or DEFAULT_CONVERSATION
        session = request.headers.get(SESSION_HEADER)
        try:
            check_path_id(conversation, "X-Memory-Conversation")
            if session is not None:
                check_session_id(session)
        except ValueError as problem:
            return error(400, "invalid_request", str(problem))
        run_id = session or service.memory.current_run(
            conversation_id=conversation, user_id=user_id, idle_seconds=service.config.idle_seconds
        )
        last = body["messages"][-1]
        text = _text(last.get("content")) if last.get("role") == "user" else None
        return cls(user_id, identity.agent, conversation, run_id, text or None)

    def context(self, service: Service) -> str:
        """The context block for the message, the current session left out."""
        assert self.message is not None
        return service.memory.context(
            self.message,
            conversation_id=self.conversation_id,
            user_id=self.user_id,
            agent_id=self.agent_id,
            exclude_run_id=self.run_id,
        ).text

    def learn(self, service: Service, reply: str) -> None:
        """Record the user turn and the answer, and learn the turn's facts (background)."""
        if self.message is None:
            return
        turns = [{"role": "user", "content": self.message}]
        if reply.strip():
            turns.append({"role": "assistant", "content": reply})
        try:
            service.memory.add(
                turns,
                user_id=self.user_id,
                agent_id=self.agent_id,
                conversation_id=self.conversation_id,
                run_id=self.run_id,
            )
        except Exception:  # a background task has nobody to answer: log it
            log.exception("recording the turn of %s failed", self.conversation_id)
            return
        service.memory.refresh(user_id=self.user_id)  # the next request reads it laid already


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _with_context(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """The messages with the memory block as a system message after the leading ones."""
    at = 0
    while at < len(messages) and messages[at].get("role") in ("system", "developer"):
        at += 1
    note = {"role": "system", "content": f"Memory (memory-dag):\n{block}"}
    return [*messages[:at], note, *messages[at:]]


async def _json_body(request: Request) -> dict[str, Any] | Response:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return error(400, "invalid_request", "the body is not JSON")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return error(400, "invalid_request", "a chat completion request has `messages`: a list")
    if not body["messages"] or not all(isinstance(m, dict) for m in body["messages"]):
        return error(400, "invalid_request", "`messages` must be a non-empty list of objects")
    return body


def _passed(answer: httpx.Response) -> Response:
    """The upstream's answer as it came: status, body, content type."""
    headers = {k: v for k, v in answer.headers.items() if k.lower() in PASSED_HEADERS}
    return Response(content=answer.content, status_code=answer.status_code, headers=headers)


def _no_upstream() -> Response:
    return error(503, "no_upstream", "no upstream is configured: set MEMORY_DAG_UPSTREAM_BASE_URL")
