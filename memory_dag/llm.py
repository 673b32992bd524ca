"""One client for every LLM step (fact extraction, reconciliation, summaries).

It talks to any OpenAI-compatible server through the `openai` package, turns every failure
into an `LLMError` with a `kind` the pipeline can branch on, retries only transient failures,
and bounds how many requests are in flight so a local model server is not flooded.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from memory_dag.config import Settings

if TYPE_CHECKING:  # imported when a client is made: ~1 s that runs without an LLM never pay
    import openai

T = TypeVar("T")
X = TypeVar("X")
Y = TypeVar("Y")

LLMErrorKind = Literal["timeout", "http", "malformed", "schema", "empty"]

#: Statuses worth another try: request timeout, conflict, rate limit, server errors.
_RETRYABLE_STATUS = {408, 409, 429}

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


class LLMConfig(BaseModel):
    """Where the model lives and how hard to push it."""

    base_url: str | None = None
    api_key: str | None = Field(None, exclude=True, repr=False)
    model: str
    timeout: float = 60.0
    max_retries: int = 2
    #: Seconds before the first retry; doubles on each further retry.
    retry_backoff: float = 0.5
    max_concurrency: int = 4
    temperature: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> LLMConfig | None:
        """The LLM part of the project settings, or None when no LLM is configured."""
        if not settings.llm_configured or not settings.llm_model:
            return None
        return cls(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model,
            timeout=settings.llm_timeout,
        )


class LLMError(RuntimeError):
    """An LLM call that produced no usable answer; `kind` says which way it failed."""

    def __init__(self, kind: LLMErrorKind, message: str) -> None:
        super().__init__(f"LLM {kind} error: {message}")
        self.kind: LLMErrorKind = kind


class LLMClient:
    """Synchronous, thread-safe client; `stats` counts calls for run metadata."""

    def __init__(self, config: LLMConfig) -> None:
        import openai

        self.config = config
        # The openai client would read OPENAI_API_KEY itself, but refuses to start without a
        # key; local servers usually need none, so a placeholder keeps them usable.
        api_key = config.api_key or os.environ.get("OPENAI_API_KEY") or "not-needed"
        self._client = openai.OpenAI(
            base_url=config.base_url,
            api_key=api_key,
            timeout=config.timeout,
            max_retries=0,  # retries are ours: counted in stats, with our own backoff
        )
        self._slots = threading.BoundedSemaphore(config.max_concurrency)
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {
            "calls": 0,
            "failures": 0,
            "requests": 0,
            "retries": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }

    def complete(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None) -> str:
        """The assistant's text for `messages`; raises LLMError instead of returning junk."""
        self._count("calls")
        try:
            return self._complete(messages, max_tokens)
        except LLMError:
            self._count("failures")
            raise

    def complete_json(
        self,
        messages: list[dict[str, Any]],
        schema: type[T],
        *,
        max_tokens: int | None = None,
    ) -> T:
        """The answer parsed as JSON and validated against `schema` (a model or a type).

        Code fences around the JSON are stripped; anything else around it is an error, since a
        model that adds prose is not following the prompt and its JSON is not trustworthy.
        """
        self._count("calls")
        try:
            text = self._complete(messages, max_tokens)
            return parse_json_answer(text, schema)
        except LLMError:
            self._count("failures")
            raise

    def map(
        self,
        fn: Callable[[X], Y],
        items: Sequence[X],
        *,
        max_concurrency: int | None = None,
    ) -> list[Y]:
        """`[fn(x) for x in items]` on a bounded thread pool; order kept, first error re-raised.

        On the first failure the items not yet started are cancelled (fail fast).
        """
        if not items:
            return []
        workers = min(self.config.max_concurrency, max_concurrency or self.config.max_concurrency)
        workers = max(1, min(workers, len(items)))
        if workers == 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm") as pool:
            futures: list[Future[Y]] = [pool.submit(fn, item) for item in items]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f in done and f.exception() is not None]
            if failed:
                for future in futures:
                    future.cancel()
                error = min(failed, key=futures.index).exception()
                assert error is not None
                raise error
            return [future.result() for future in futures]

    def _complete(self, messages: list[dict[str, Any]], max_tokens: int | None) -> str:
        attempts = self.config.max_retries + 1
        for attempt in range(attempts):
            try:
                return self._request(messages, max_tokens)
            except _Retryable as exc:
                if attempt + 1 >= attempts:
                    raise exc.error from exc.__cause__
                self._count("retries")
                time.sleep(self.config.retry_backoff * (2**attempt))
        raise AssertionError("unreachable: the loop returns or raises")

    def _request(self, messages: list[dict[str, Any]], max_tokens: int | None) -> str:
        import openai

        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
        }
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        self._count("requests")
        with self._slots:
            try:
                response = self._client.chat.completions.create(**kwargs)
            except openai.APITimeoutError as exc:
                error = LLMError("timeout", f"no answer within {self.config.timeout:g}s")
                raise _Retryable(error) from exc
            except openai.APIConnectionError as exc:
                raise _Retryable(LLMError("http", f"connection failed: {exc}")) from exc
            except openai.APIStatusError as exc:
                error = LLMError("http", f"HTTP {exc.status_code}: {_error_text(exc)}")
                if exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500:
                    raise _Retryable(error) from exc
                raise error from exc
            except (json.JSONDecodeError, openai.APIResponseValidationError) as exc:
                raise LLMError(
                    "malformed", f"response body is not a chat completion: {exc}"
                ) from exc
        if response.usage is not None:
            self._count("prompt_tokens", response.usage.prompt_tokens or 0)
            self._count("completion_tokens", response.usage.completion_tokens or 0)
        if not getattr(response, "choices", None):
            raise LLMError("malformed", "response has no choices")
        content = response.choices[0].message.content
        if content is None or not content.strip():
            reason = response.choices[0].finish_reason
            raise LLMError("empty", f"the model returned no text (finish_reason={reason})")
        return content

    def _count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.stats[key] += amount


class _Retryable(Exception):
    """Internal wrapper marking an LLMError as transient."""

    def __init__(self, error: LLMError) -> None:
        super().__init__(str(error))
        self.error = error


def parse_json_answer(text: str, schema: type[T]) -> T:
    """Parse a model's JSON answer (optionally fenced) and validate it against `schema`."""
    fenced = _FENCE.match(text)
    payload = fenced.group(1) if fenced else text.strip()
    if not payload.strip():
        raise LLMError("empty", "the answer holds no JSON")
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise LLMError("malformed", f"answer is not JSON ({exc}): {_preview(payload)}") from exc
    try:
        return TypeAdapter(schema).validate_python(data)
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
        raise LLMError("schema", f"answer does not match {_name(schema)}: {errors}") from exc


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return _preview(exc.response.text if exc.response is not None else str(exc))


def _preview(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _name(schema: object) -> str:
    return getattr(schema, "__name__", None) or repr(schema)
