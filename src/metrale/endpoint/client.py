"""OpenAI-compatible chat client that measures every call it makes, and retries what is worth it.

The numbers (TTFT, latency = E2E, chunk times, completion tokens and their source) and the
failure kinds are those of `metrale.endpoint.stream`, where they are defined once for every
client; the transport is `metrale.endpoint.http`. This module adds what rollouts need on top:
the request body, the text of the answer, and retries.

- **retries**: attempts beyond the first. Retried: connection errors (refused, reset, dropped
  mid-stream), HTTP 429 and 5xx, with exponential backoff and full jitter (or the server's
  Retry-After). Not retried: timeouts, 4xx other than 429, malformed or incomplete streams, broken
  HTTP (`bad_status_line`, `bad_header`, `headers_too_large`, `bad_chunk`) and a body over the size
  cap (`response_too_large`, see `ClientOptions.response_cap`): a benchmark wants those to show.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, Field

from metrale.backoff import backoff_s
from metrale.bounds import BYTES, COUNT, DELAY_S, TIMEOUT_S, pydantic_range
from metrale.endpoint.http import ConnectionPool
from metrale.endpoint.stream import CallFailed, Completion, StreamParser, exchange
from metrale.endpoint.stream import ToolCall as ToolCall  # re-exported: records name it


class Target(BaseModel):
    """The endpoint under test: an OpenAI-compatible base URL ending in /v1, and a model."""

    base_url: str
    model: str
    api_key: str | None = None
    embedded: bool = False

    @staticmethod
    def normalize_url(url: str) -> str:
        """`http://h:p` and `http://h:p/` mean `http://h:p/v1`; any other path is kept."""
        url = url.strip().rstrip("/")
        scheme_end = url.find("://")
        path = url[scheme_end + 3 :].partition("/")[2] if scheme_end >= 0 else ""
        return url if path else url + "/v1"


#: The response-size cap when none is given: generous for any real completion (an SSE chunk
#: per token is 150-600 bytes with ids and logprobs), small enough that an endless stream or
#: one 50 MB event costs megabytes, not gigabytes.
RESPONSE_SLACK_BYTES = 16 * 1024
RESPONSE_BYTES_PER_TOKEN = 4 * 1024
#: ... and when the call sets no max_tokens.
RESPONSE_DEFAULT_CAP_BYTES = 16 * 1024 * 1024


class ClientOptions(BaseModel):
    request_timeout_s: float = Field(default=600.0, **pydantic_range(TIMEOUT_S))
    retries: int = Field(default=2, **pydantic_range(COUNT))
    backoff_base_s: float = Field(default=0.25, **pydantic_range(DELAY_S))
    backoff_max_s: float = Field(default=8.0, **pydantic_range(DELAY_S))
    stream: bool = True
    #: response body cap in bytes; None: derived from max_tokens (`response_cap`); 0: no cap
    max_response_bytes: int | None = Field(default=None, **pydantic_range(BYTES))

    def response_cap(self, max_tokens: int | None) -> int | None:
        """Bytes of body one call may receive: past it, the call fails as `response_too_large`.

        cap = `max_response_bytes` when given (0 = none), else 16 KiB + 4 KiB × max_tokens,
        or 16 MiB without max_tokens.
        """
        if self.max_response_bytes is not None:
            return self.max_response_bytes or None
        if max_tokens is None:
            return RESPONSE_DEFAULT_CAP_BYTES
        return RESPONSE_SLACK_BYTES + RESPONSE_BYTES_PER_TOKEN * max_tokens


class CallRecord(BaseModel):
    """What one chat call did and how long it took (see the module docstring for definitions)."""

    started_at: float = Field(description="wall-clock time of the first attempt (epoch s)")
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_source: str | None = None
    finish_reason: str | None = None
    retries: int = 0
    status: int | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    chunk_times_s: list[float] | None = None
    connect_s: float | None = Field(
        None, description="connect (+ TLS) time of the connection this call opened; None: reused"
    )
    error: str | None = None
    error_kind: str | None = None


class EndpointError(Exception):
    """A call that failed after its retries; `kind` names the failure, `call` has the record."""

    def __init__(self, kind: str, message: str, call: CallRecord | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.call = call

    @property
    def retries(self) -> int:
        return self.call.retries if self.call else 0


def chat_body(
    model: str,
    messages: Sequence[dict[str, Any]],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    stream: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat completion's request body: only the fields given, `extra` last (it may override
    any of them)."""
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if seed is not None:
        body["seed"] = seed
    if tools:
        body["tools"] = list(tools)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if extra:
        body.update(extra)
    return body


class ChatModel(Protocol):
    """What a rollout's stages call for a model: `ChatClient`, or a caller's own measuring
    client with the same `chat` (serve's live sessions: each call one turn of a session)."""

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
        record_chunks: bool = False,
    ) -> CallRecord: ...


class ChatClient:
    """One pool of keep-alive connections to a target. Use as an async context manager."""

    def __init__(self, target: Target, options: ClientOptions | None = None) -> None:
        self.target = target
        self.options = options or ClientOptions()
        self._pool: ConnectionPool | None = None
        self._rng = random.Random()

    async def __aenter__(self) -> ChatClient:
        headers = {"Content-Type": "application/json"}
        if self.target.api_key:
            headers["Authorization"] = f"Bearer {self.target.api_key}"
        # Unbounded pool: the benchmark's own concurrency bound is the only bound; a pool limit
        # here would add hidden queueing to every measured latency.
        self._pool = ConnectionPool(self.target.base_url, headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
        record_chunks: bool = False,
    ) -> CallRecord:
        """Send one chat completion; retry what is retryable; raise `EndpointError` at the end."""
        body = chat_body(
            self.target.model, messages, max_tokens=max_tokens, temperature=temperature,
            seed=seed, tools=tools, stream=self.options.stream, extra=extra,
        )  # fmt: skip
        payload = orjson.dumps(body)
        cap = self.options.response_cap(max_tokens)
        started_at = time.time()
        attempt = 0
        while True:
            try:
                done = await self._attempt(payload, record_chunks, cap)
            except CallFailed as exc:
                if exc.retryable and attempt < self.options.retries:
                    attempt += 1
                    await asyncio.sleep(self._backoff(attempt, exc.retry_after))
                    continue
                record = CallRecord(
                    started_at=started_at, retries=attempt, status=exc.status, error=str(exc),
                    error_kind=exc.kind,
                )  # fmt: skip
                raise EndpointError(exc.kind, str(exc), record) from None
            # model_construct: the values come from our own parser, which keeps pydantic off
            # the per-call hot path.
            return CallRecord.model_construct(
                started_at=started_at, retries=attempt, status=done.status, ttft_s=done.ttft_s,
                latency_s=done.e2e_s, prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens, token_source=done.token_source,
                finish_reason=done.finish_reason, content=done.content,
                reasoning=done.reasoning, tool_calls=done.tool_calls,
                chunk_times_s=done.chunk_times_s, connect_s=done.connect_s, error=None,
                error_kind=None,
            )  # fmt: skip

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Full jitter: uniform(0, min(max, base * 2**(attempt-1))), or the server's Retry-After."""
        if retry_after is not None:
            return min(retry_after, self.options.backoff_max_s)
        opts = self.options
        return backoff_s(attempt, opts.backoff_base_s, opts.backoff_max_s, rng=self._rng)

    async def _attempt(self, payload: bytes, record_chunks: bool, cap: int | None) -> Completion:
        if self._pool is None:
            raise RuntimeError("ChatClient used outside 'async with'")
        parser = StreamParser(keep_text=True, keep_times=record_chunks)
        return await exchange(
            self._pool, "/chat/completions", payload, time.perf_counter(), parser,
            timeout_s=self.options.request_timeout_s, cap=cap,
        )  # fmt: skip
