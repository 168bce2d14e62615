"""OpenAI-compatible chat client that measures every call it makes.

Definitions (each call, all on the monotonic clock, `send` = the moment the request is handed to
the connection, after any client-side queueing):

- **TTFT** (`ttft_s`) = first chunk carrying output (content, reasoning content or a tool-call
  delta) − send. For a non-streaming call it equals the latency.
- **latency** (`latency_s`) = last byte of the response − send.
- **completion tokens**: `usage.completion_tokens` from the server (requested with
  `stream_options.include_usage`), `token_source="usage"`; where the server sends no usage, the
  number of output-bearing chunks, `token_source="counted"` (one token a chunk is what llama.cpp,
  vLLM and SGLang send without speculative decoding).
- **retries**: attempts beyond the first. Retried: connection errors (refused, reset, dropped
  mid-stream), HTTP 429 and 5xx, with exponential backoff and full jitter. Not retried: timeouts,
  4xx other than 429, malformed streams, broken HTTP (`bad_status_line`, `bad_header`,
  `headers_too_large`, `bad_chunk`) and a body over the size cap (`response_too_large`, see
  `ClientOptions.response_cap`): a benchmark wants those to show.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, Field

from metrale.endpoint.http import (
    ConnectionPool,
    HttpConnectionError,
    HttpProtocolError,
    Response,
)

#: How long to wait, after [DONE], for the rest of a streamed body before giving up the
#: connection instead of reusing it.
DRAIN_TIMEOUT_S = 1.0


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
    request_timeout_s: float = 600.0
    retries: int = 2
    backoff_base_s: float = 0.25
    backoff_max_s: float = 8.0
    stream: bool = True
    #: response body cap in bytes; None: derived from max_tokens (`response_cap`); 0: no cap
    max_response_bytes: int | None = None

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


class ToolCall(BaseModel):
    id: str = ""
    name: str = ""
    arguments: str = ""


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


class _Retryable(Exception):
    def __init__(self, kind: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


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
        body: dict[str, Any] = {"model": self.target.model, "messages": list(messages)}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        if seed is not None:
            body["seed"] = seed
        if tools:
            body["tools"] = list(tools)
        if self.options.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if extra:
            body.update(extra)
        payload = orjson.dumps(body)
        cap = self.options.response_cap(max_tokens)
        started_at = time.time()
        attempt = 0
        while True:
            # Each attempt fills a plain dict; the record is built once (model_construct: the
            # values come from our own parser), which keeps pydantic off the per-call hot path.
            fields: dict[str, Any] = {"started_at": started_at, "retries": attempt}
            try:
                await self._attempt(payload, fields, record_chunks, cap)
                return CallRecord.model_construct(**fields)
            except _Retryable as exc:
                if attempt >= self.options.retries:
                    record = CallRecord(**fields, error=str(exc), error_kind=exc.kind)
                    raise EndpointError(exc.kind, str(exc), record) from None
                attempt += 1
                await asyncio.sleep(self._backoff(attempt, exc.retry_after))
            except EndpointError as exc:
                exc.call = CallRecord(**fields, error=str(exc), error_kind=exc.kind)
                raise

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Full jitter: uniform(0, min(max, base * 2**(attempt-1))), or the server's Retry-After."""
        if retry_after is not None:
            return min(retry_after, self.options.backoff_max_s)
        cap = min(self.options.backoff_max_s, self.options.backoff_base_s * 2 ** (attempt - 1))
        return self._rng.uniform(0, cap)

    async def _attempt(
        self, payload: bytes, fields: dict[str, Any], record_chunks: bool, cap: int | None
    ) -> None:
        if self._pool is None:
            raise RuntimeError("ChatClient used outside 'async with'")
        send = time.perf_counter()
        resp: Response | None = None
        try:
            async with asyncio.timeout(self.options.request_timeout_s):
                resp = await self._pool.post("/chat/completions", payload)
                fields["status"] = resp.status
                if resp.status == 429 or resp.status >= 500:
                    text = await _error_text(resp, 200)
                    retry_after = _retry_after(resp.headers.get("retry-after"))
                    raise _Retryable(
                        f"http_{resp.status}", f"HTTP {resp.status}: {text}", retry_after
                    )
                if resp.status >= 400:
                    text = await _error_text(resp, 300)
                    raise EndpointError(f"http_{resp.status}", f"HTTP {resp.status}: {text}")
                if self.options.stream and resp.content_type == "text/event-stream":
                    await _read_stream(resp, fields, send, record_chunks, cap)
                else:
                    data = orjson.loads(await resp.read(cap))
                    _read_body(data, fields)
                    fields["ttft_s"] = time.perf_counter() - send
                fields.setdefault("latency_s", time.perf_counter() - send)
        except orjson.JSONDecodeError:
            raise EndpointError("malformed_response", "response body is not JSON") from None
        except TimeoutError:
            raise EndpointError(
                "timeout", f"no complete response within {self.options.request_timeout_s:g} s"
            ) from None
        except HttpConnectionError as exc:
            raise _Retryable("connection", str(exc)) from None
        except HttpProtocolError as exc:
            raise EndpointError(exc.kind, str(exc)) from None
        finally:
            if resp is not None:
                resp.release()


async def _error_text(resp: Response, keep: int) -> str:
    """The start of an error response's body; a huge or broken one is not read to its end."""
    try:
        body = await resp.read(64 * 1024)
    except (HttpProtocolError, HttpConnectionError):
        return "(body unreadable)"
    return body[:keep].decode(errors="replace")


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def _read_stream(
    resp: Response, fields: dict[str, Any], send: float, record_chunks: bool, cap: int | None
) -> None:
    """Parse an SSE stream as bytes arrive: events split on blank lines, one timestamp per read.

    Reading whole network reads (not line by line) and keeping the running state in locals
    keeps the per-chunk cost to one `orjson.loads`: at 1,024 concurrent streams the client, not
    the server, would otherwise set the pace.
    """
    state = _StreamState(record_chunks)
    buf = b""
    chunks = resp.iter_chunks(cap)
    async for data in chunks:
        now = time.perf_counter() - send
        buf += data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if state.feed(event, now):
                break
        if state.done:
            break
    if buf.strip() and not state.done:
        state.feed(buf, time.perf_counter() - send)
    state.finish(fields)
    if state.done:
        # The call ends at [DONE]; then read what is left of the body (the chunked terminator)
        # so that the connection goes back to the pool: a hosted API would otherwise pay a new
        # TLS handshake inside the next call's TTFT.
        fields["latency_s"] = time.perf_counter() - send
        with contextlib.suppress(TimeoutError, HttpConnectionError, HttpProtocolError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                async for _ in chunks:
                    pass


class _StreamState:
    __slots__ = (
        "chunk_times", "content", "counted", "done", "finish_reason", "prompt_tokens",
        "reasoning", "tool_calls", "ttft", "usage_tokens",
    )  # fmt: skip

    def __init__(self, record_chunks: bool) -> None:
        self.chunk_times: list[float] | None = [] if record_chunks else None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, ToolCall] = {}
        self.counted = 0
        self.done = False
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.usage_tokens: int | None = None
        self.ttft: float | None = None

    def feed(self, event: bytes, now: float) -> bool:
        """Take one SSE event; True at `[DONE]`."""
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments (":"), event names, ids: nothing to measure
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                return True
            self._chunk(data, now)
        return False

    def _chunk(self, data: bytes, now: float) -> None:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise EndpointError(
                "malformed_stream", f"stream chunk is not JSON: {data[:80]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise EndpointError("malformed_stream", f"stream chunk is not an object: {data[:80]!r}")
        if "error" in chunk:
            raise EndpointError("stream_error", f"server error in stream: {chunk['error']}")
        usage = chunk.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.usage_tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            calls = delta.get("tool_calls")
            if content or reasoning or calls:
                if self.ttft is None:
                    self.ttft = now
                if self.chunk_times is not None:
                    self.chunk_times.append(now)
                self.counted += 1
            if content:
                self.content.append(content)
            if reasoning:
                self.reasoning.append(reasoning)
            for call in calls or ():
                slot = self.tool_calls.setdefault(
                    call.get("index", len(self.tool_calls)), ToolCall()
                )
                slot.id = call.get("id") or slot.id
                fn = call.get("function") or {}
                slot.name += fn.get("name") or ""
                slot.arguments += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def finish(self, fields: dict[str, Any]) -> None:
        if self.finish_reason is None:
            if not self.done:
                raise _Retryable("connection", "stream ended before [DONE] or a finish_reason")
            # [DONE] with no finish_reason: the server cut the generation short (llama.cpp's
            # Python server does this to a stream when another request interrupts it).
            raise EndpointError(
                "incomplete_stream", "stream ended with [DONE] but no finish_reason"
            )
        fields["ttft_s"] = self.ttft
        fields["content"] = "".join(self.content)
        fields["reasoning"] = "".join(self.reasoning)
        fields["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        fields["finish_reason"] = self.finish_reason
        fields["chunk_times_s"] = self.chunk_times
        fields["prompt_tokens"] = self.prompt_tokens
        if self.usage_tokens is not None:
            fields["completion_tokens"], fields["token_source"] = self.usage_tokens, "usage"
        else:
            fields["completion_tokens"], fields["token_source"] = self.counted, "counted"


def _read_body(data: Any, fields: dict[str, Any]) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise EndpointError("malformed_response", "response has no 'choices' list")
    usage = data.get("usage") or {}
    if usage:
        fields["prompt_tokens"] = usage.get("prompt_tokens")
        fields["completion_tokens"] = usage.get("completion_tokens")
        fields["token_source"] = "usage"
    if data["choices"]:
        choice = data["choices"][0]
        message = choice.get("message") or {}
        fields["content"] = message.get("content") or ""
        fields["reasoning"] = message.get("reasoning_content") or message.get("reasoning") or ""
        fields["finish_reason"] = choice.get("finish_reason")
        fields["tool_calls"] = [
            ToolCall(
                id=c.get("id") or "",
                name=(c.get("function") or {}).get("name") or "",
                arguments=(c.get("function") or {}).get("arguments") or "",
            )
            for c in message.get("tool_calls") or ()
        ]
