"""A real OpenAI-compatible HTTP server for tests, scripted reply by reply.

Tests talk HTTP to it through the real `openai` client, so retries, timeouts and
malformed bodies are exercised exactly as in production. Nothing is monkeypatched.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import numpy as np
import pytest


@dataclass(frozen=True)
class Reply:
    """What the server does for one chat request; build it with the static constructors."""

    kind: str
    content: str = ""
    code: int = 200
    body: str = ""
    seconds: float = 0.0
    then: Reply | None = None

    @staticmethod
    def text(content: str) -> Reply:
        return Reply(kind="text", content=content)

    @staticmethod
    def json(obj: Any) -> Reply:
        return Reply(kind="text", content=json.dumps(obj))

    @staticmethod
    def status(code: int, body: str = '{"error": {"message": "scripted failure"}}') -> Reply:
        return Reply(kind="status", code=code, body=body)

    @staticmethod
    def delay(seconds: float, then: Reply) -> Reply:
        return Reply(kind="delay", seconds=seconds, then=then)

    @staticmethod
    def malformed() -> Reply:
        """HTTP 200 whose body is not JSON at all."""
        return Reply(kind="status", code=200, body="<html>this is not json</html>")

    @staticmethod
    def empty() -> Reply:
        return Reply(kind="text", content="")


def hash_embedding(text: str, dims: int) -> list[float]:
    """Deterministic unit vector for a text, so equal texts embed equally across runs."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    vec = np.random.default_rng(seed).standard_normal(dims)
    return (vec / np.linalg.norm(vec)).tolist()


class ScriptedOpenAIServer:
    """OpenAI-compatible server on 127.0.0.1 with a FIFO of scripted chat replies.

    `max_in_flight` records the most chat requests handled at once (for concurrency bounds).
    """

    def __init__(
        self,
        embed_dims: int = 8,
        handler: Callable[[dict[str, Any]], Reply] | None = None,
    ) -> None:
        self.embed_dims = embed_dims
        self.handler = handler
        self.requests: list[dict[str, Any]] = []
        self.base_url = ""
        self.max_in_flight = 0
        self._replies: deque[Reply] = deque()
        self._embedding_failures: deque[int] = deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._in_flight = 0

    def push(self, *replies: Reply) -> None:
        """Queue chat replies, served in order."""
        with self._lock:
            self._replies.extend(replies)

    def push_embedding_failure(self, status: int, times: int = 1) -> None:
        """Make the next `times` embeddings requests fail with `status`."""
        with self._lock:
            self._embedding_failures.extend([status] * times)

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet (a test can assert it used its whole script)."""
        with self._lock:
            return len(self._replies)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def start(self) -> ScriptedOpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Keep pytest output clean."""

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps(server._models_body()))
                else:
                    self._send(404, _error_body(f"unknown path {self.path}"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    self._send(400, _error_body("request body is not JSON"))
                    return
                with server._lock:
                    server.requests.append({"path": self.path, "body": body})
                if self.path.endswith("/chat/completions"):
                    server._track(+1)
                    try:
                        self._chat(body)
                    finally:
                        server._track(-1)
                elif self.path.endswith("/embeddings"):
                    self._embeddings(body)
                else:
                    self._send(404, _error_body(f"unknown path {self.path}"))

            def _chat(self, body: dict[str, Any]) -> None:
                reply = server._next_reply(body)
                while reply.kind == "delay":
                    time.sleep(reply.seconds)
                    assert reply.then is not None
                    reply = reply.then
                if reply.kind == "status":
                    self._send(reply.code, reply.body)
                elif body.get("stream"):
                    self._send(200, _event_stream(body, reply.content), "text/event-stream")
                else:
                    self._send(200, json.dumps(_completion(body, reply.content)))

            def _embeddings(self, body: dict[str, Any]) -> None:
                with server._lock:
                    failure = (
                        server._embedding_failures.popleft() if server._embedding_failures else None
                    )
                if failure is not None:
                    self._send(failure, _error_body(f"scripted embeddings failure {failure}"))
                    return
                inputs = body.get("input", [])
                texts = [inputs] if isinstance(inputs, str) else list(inputs)
                data = [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": hash_embedding(str(t), server.embed_dims),
                    }
                    for i, t in enumerate(texts)
                ]
                tokens = sum(len(str(t).split()) for t in texts)
                out = {
                    "object": "list",
                    "data": data,
                    "model": body.get("model", "scripted"),
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                }
                self._send(200, json.dumps(out))

            def _send(self, code: int, text: str, content_type: str = "application/json") -> None:
                payload = text.encode("utf-8")
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (e.g. its timeout fired during a delay)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        # A short poll interval keeps stop() (and so every test's teardown) fast.
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
            handler = self.handler
        if handler is not None:
            return handler(body)
        return Reply.status(
            500,
            _error_body("ScriptedOpenAIServer: no scripted reply left and no handler set"),
        )

    def _track(self, delta: int) -> None:
        with self._lock:
            self._in_flight += delta
            self.max_in_flight = max(self.max_in_flight, self._in_flight)

    @staticmethod
    def _models_body() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": "scripted-model", "object": "model", "created": 0, "owned_by": "tests"}
            ],
        }


def _error_body(message: str) -> str:
    return json.dumps({"error": {"message": message, "type": "scripted", "code": None}})


def _event_stream(request: dict[str, Any], content: str) -> str:
    """A streamed answer: one `chat.completion.chunk` event per word, then `[DONE]`."""
    created = int(time.time())
    name = f"chatcmpl-scripted-{time.monotonic_ns()}"
    words = content.split(" ")
    pieces = [w if i == len(words) - 1 else w + " " for i, w in enumerate(words)]
    events = []
    for index, piece in enumerate([*pieces, None]):
        delta = {"content": piece} if piece is not None else {}
        if index == 0:
            delta["role"] = "assistant"
        chunk = {
            "id": name,
            "object": "chat.completion.chunk",
            "created": created,
            "model": request.get("model", "scripted-model"),
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": None if piece is not None else "stop"}
            ],
        }
        events.append(f"data: {json.dumps(chunk)}\n\n")
    return "".join(events) + "data: [DONE]\n\n"


def _completion(request: dict[str, Any], content: str) -> dict[str, Any]:
    prompt_words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
    completion_words = len(content.split())
    return {
        "id": f"chatcmpl-scripted-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted-model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_words,
            "completion_tokens": completion_words,
            "total_tokens": prompt_words + completion_words,
        },
    }


@pytest.fixture
def openai_server() -> Iterator[ScriptedOpenAIServer]:
    """A started scripted server, stopped after the test."""
    with ScriptedOpenAIServer() as server:
        yield server
