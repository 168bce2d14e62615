"""One completion request on the wire, and what its response says and when: the only place in
metrale where TTFT, E2E, chunk times and output tokens are defined. `ChatClient` (rollouts,
with retries and text) and serve's load client (no retries, no text) both send through
`exchange` and read through `StreamParser`, so a figure means the same in every benchmark.

The timeline of one request, on `time.perf_counter()`, every time in seconds since *sent*:

- **send**: the moment the request is handed to the connection pool, after any client-side
  queueing (serve's scheduling lag ends here).
- **connect** (`connect_s`): when the pool has no idle connection, the time to open one (TCP
  connect, and the TLS handshake for https), recorded apart, as k6 separates connecting from
  waiting; None when the request reused a kept-alive connection.
- **sent**: the request written to an open connection (`Completion.sent_s` after send). Every
  time below counts from here, so a connect is never part of TTFT or E2E.
- **headers**: the status line and headers read. Not a figure of its own: a server may send
  its headers when it accepts a request or only with its first token.
- **output chunk**: an SSE event that carries output: `delta.content`, `delta.reasoning_content`
  (or `reasoning`), a `delta.tool_calls` entry, or a `/completions` choice's `text`. Events with
  only a role, a finish reason or usage, and SSE comments, are not chunks. Each piece the
  connection receives is stamped once, when its bytes arrive (the kernel's receive time on
  plain TCP, `endpoint.wire`), before any parsing; every event completed by that piece gets its
  stamp, so the parsing of one burst cannot move the times of the next.
- **client lag** (`client_lag_s`): per request, the longest time from a piece's arrival to the
  end of its processing. It measures the client, not the server: when it is large, the client
  fell behind the stream (and a read then holding several chunks stamps them as one).
- **TTFT** = first output chunk − sent (reasoning and tool calls count: they are output).
  **TTFC** = first content chunk (`content` or `text`) − sent.
- **E2E** = the read carrying the stream's last event (`[DONE]`, or the last `data:` event of a
  server that sends none) − sent. What follows `[DONE]` (the chunked terminator) is transport:
  it is drained, so that the connection can be reused, outside the figure.
- Non-streaming response (`--no-stream`, or a server that ignores `stream`): TTFT = TTFC = E2E =
  the arrival of the body's last bytes − sent; it is one chunk.
- **ITL gaps** = t_i − t_{i−1} between consecutive output chunks (`chunk_gaps`).
- **Output tokens** = `usage.completion_tokens` when the server sends it (`token_source =
  "usage"`), else the number of output chunks (`"counted"`: one token a chunk is what llama.cpp,
  vLLM and SGLang send without speculative decoding); a non-streaming body without usage has no
  chunks to count: tokens unknown (None).
- **Chunk tokens** (`spread_tokens`): from per-chunk cumulative usage where every chunk carries
  it (vLLM's `continuous_usage_stats`), else output tokens spread evenly, else 1 each.

Failures are `CallFailed` with a `kind`: `http_<status>` (any non-2xx; retryable for 429 and
5xx), `timeout` (no complete response within the request timeout), `connection` (refused,
reset, closed mid-response, or a stream that ended before `[DONE]` or a finish reason:
retryable), `malformed_response`, `malformed_stream`, `stream_error` (an `error` event),
`incomplete_stream` (`[DONE]` but no finish reason: the server cut the generation short), and
the transport's `bad_status_line`, `bad_header`, `headers_too_large`, `bad_chunk`,
`response_too_large`. Whether to retry is the caller's: serve never does (a retry changes the
load it measures).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from metrale.endpoint.http import (
    ConnectionPool,
    HttpConnectionError,
    HttpProtocolError,
    Outgoing,
    Response,
)

_NO_DELTA: dict[str, Any] = {}

#: How long to wait, after [DONE], for the rest of a streamed body before giving up the
#: connection instead of reusing it.
DRAIN_TIMEOUT_S = 1.0


class ToolCall(BaseModel):
    id: str = ""
    name: str = ""
    arguments: str = ""


class CallFailed(Exception):
    """One request that did not give a complete response (see the module docstring's kinds)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass(slots=True)
class Completion:
    """What one response said and when (times in seconds since sent, module docstring)."""

    status: int
    ttft_s: float | None = None
    ttfc_s: float | None = None
    e2e_s: float | None = None
    #: output chunks' arrival times; None unless asked for
    chunk_times_s: list[float] | None = None
    #: cumulative `usage.completion_tokens` of the output chunks that carried usage
    chunk_usage: list[int] = field(default_factory=list)
    chunks: int = 0
    reasoning_chunks: int = 0
    prompt_tokens: int | None = None
    #: `usage.prompt_tokens_details.cached_tokens`: prompt tokens the server's prefix cache served
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    token_source: Literal["usage", "counted"] | None = None
    finish_reason: str | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: the write to an open connection, in seconds after the caller's send (the wait for a
    #: connection: connecting, or a stale keep-alive one replaced)
    sent_s: float = 0.0
    #: connect (+ TLS) time when the request opened its connection; None on a reused one
    connect_s: float | None = None
    #: client lag: the longest time from a piece's arrival to the end of its processing
    client_lag_s: float | None = None

    def chunk_tokens(self) -> list[float]:
        """Tokens carried by each output chunk (`spread_tokens`)."""
        return spread_tokens(self.chunks, self.completion_tokens, self.chunk_usage)


def cached_tokens(usage: dict[str, Any]) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` (OpenAI's field; vLLM and SGLang send it),
    None when absent or not a count."""
    details = usage.get("prompt_tokens_details")
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def spread_tokens(chunks: int, output_tokens: int | None, cumulative: Sequence[int]) -> list[float]:
    """Tokens carried by each chunk.

    From per-chunk cumulative usage where the server sends it on every chunk: the differences.
    Else `output_tokens / chunks` each (exact when the server sends one token a chunk, the usual
    case; an even spread otherwise). Else 1 each.
    """
    if chunks == 0:
        return []
    if len(cumulative) == chunks:
        prev, out = 0, []
        for c in cumulative:
            out.append(float(max(c - prev, 0)))
            prev = c
        return out
    if output_tokens:
        return [output_tokens / chunks] * chunks
    return [1.0] * chunks


def chunk_gaps(chunk_times_s: Sequence[float]) -> list[float]:
    """ITL gaps: t_i − t_{i−1} for consecutive output chunks i = 1..n−1 (s)."""
    return [b - a for a, b in itertools.pairwise(chunk_times_s)]


class StreamParser:
    """The running state of one response. `feed` takes SSE events, `body` a non-streaming
    JSON answer, `finish` checks the end and gives the `Completion`.

    The running state lives in slots, not in a record: at 1,024 concurrent streams the per-event
    cost must stay one `orjson.loads` and a few dict lookups, or the client sets the pace.
    """

    __slots__ = (
        "cached_tokens",
        "content",
        "done",
        "finish_reason",
        "keep_text",
        "keep_times",
        "last_event",
        "prompt_tokens",
        "reasoning",
        "reasoning_chunks",
        "times",
        "tool_calls",
        "ttfc",
        "usage_tokens",
        "usages",
    )  # fmt: skip

    def __init__(self, *, keep_text: bool = True, keep_times: bool = False) -> None:
        self.keep_text = keep_text
        self.keep_times = keep_times
        #: every output chunk's stamp (kept always: TTFT is the first, the count is its length)
        self.times: list[float] = []
        self.usages: list[int] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, ToolCall] = {}
        self.reasoning_chunks = 0
        self.done = False
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.usage_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.ttfc: float | None = None
        self.last_event: float | None = None

    def feed(self, event: bytes, now: float) -> bool:
        """Take one SSE event (its lines, without the blank line); True at `[DONE]`.

        One method, the common case (a content delta) first: it runs once per token of every
        stream, on the path whose CPU sets the highest request rate serve can drive.
        """
        loads = orjson.loads
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments (":"), event names, ids: nothing to measure
            self.last_event = now
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                return True
            try:
                chunk = loads(data)
            except orjson.JSONDecodeError:
                message = f"stream chunk is not JSON: {data[:80]!r}"
                raise CallFailed("malformed_stream", message) from None
            if type(chunk) is not dict:
                message = f"stream chunk is not an object: {data[:80]!r}"
                raise CallFailed("malformed_stream", message)
            if "error" in chunk:
                message = f"server error in stream: {str(chunk['error'])[:200]}"
                raise CallFailed("stream_error", message)
            usage = chunk.get("usage")
            if usage:
                self.prompt_tokens = usage.get("prompt_tokens")
                self.usage_tokens = usage.get("completion_tokens")
                self.cached_tokens = cached_tokens(usage)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or _NO_DELTA
                content = delta.get("content") or choice.get("text")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                calls = delta.get("tool_calls")
                if content:
                    if self.ttfc is None:
                        self.ttfc = now
                    if self.keep_text:
                        self.content.append(content)
                elif not (reasoning or calls):
                    if choice.get("finish_reason"):
                        self.finish_reason = choice["finish_reason"]
                    continue
                else:
                    self.reasoning_chunks += 1
                self.times.append(now)
                if usage and usage.get("completion_tokens") is not None:
                    self.usages.append(usage["completion_tokens"])
                if self.keep_text and (reasoning or calls):
                    self._keep(reasoning, calls)
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        return False

    def _keep(self, reasoning: str | None, calls: Any) -> None:
        if reasoning:
            self.reasoning.append(reasoning)
        for call in calls or ():
            slot = self.tool_calls.setdefault(call.get("index", len(self.tool_calls)), ToolCall())
            slot.id = call.get("id") or slot.id
            fn = call.get("function") or {}
            slot.name += fn.get("name") or ""
            slot.arguments += fn.get("arguments") or ""

    def finish(self, status: int) -> Completion:
        """The completion of a stream that ended; `CallFailed` when it ended too early."""
        if self.finish_reason is None:
            if not self.done:
                raise CallFailed(
                    "connection", "stream ended before [DONE] or a finish_reason", retryable=True
                )
            # [DONE] with no finish_reason: the server cut the generation short (llama.cpp's
            # Python server does this to a stream when another request interrupts it).
            raise CallFailed("incomplete_stream", "stream ended with [DONE] but no finish_reason")
        counted = self.usage_tokens is None
        times = self.times
        return Completion(
            status=status,
            ttft_s=times[0] if times else None,
            ttfc_s=self.ttfc,
            e2e_s=self.last_event,
            chunk_times_s=times if self.keep_times else None,
            chunk_usage=self.usages,
            chunks=len(times),
            reasoning_chunks=self.reasoning_chunks,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            completion_tokens=len(times) if counted else self.usage_tokens,
            token_source="counted" if counted else "usage",
            finish_reason=self.finish_reason,
            content="".join(self.content),
            reasoning="".join(self.reasoning),
            tool_calls=[self.tool_calls[i] for i in sorted(self.tool_calls)],
        )

    def body(self, data: Any, status: int, now: float) -> Completion:
        """A non-streaming answer: one chunk, TTFT = TTFC = E2E = `now`."""
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise CallFailed("malformed_response", "response has no 'choices' list")
        done = Completion(status=status, ttft_s=now, ttfc_s=now, e2e_s=now, chunks=1)
        done.chunk_times_s = [now] if self.keep_times else None
        usage = data.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            done.prompt_tokens = usage.get("prompt_tokens")
            done.cached_tokens = cached_tokens(usage)
            done.completion_tokens = usage["completion_tokens"]
            done.token_source = "usage"
        if data["choices"]:
            choice = data["choices"][0]
            done.finish_reason = choice.get("finish_reason")
            if self.keep_text:
                message = choice.get("message") or {}
                done.content = message.get("content") or choice.get("text") or ""
                done.reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
                done.tool_calls = [
                    ToolCall(
                        id=c.get("id") or "",
                        name=(c.get("function") or {}).get("name") or "",
                        arguments=(c.get("function") or {}).get("arguments") or "",
                    )
                    for c in message.get("tool_calls") or ()
                ]
        return done


async def exchange(
    pool: ConnectionPool,
    path: str,
    payload: bytes,
    send: float,
    parser: StreamParser,
    *,
    timeout_s: float,
    cap: int | None,
    outgoing: Outgoing | None = None,
) -> Completion:
    """POST `payload` and read the whole response within `timeout_s`; `send` is the caller's
    `perf_counter()` just before the call (so a failure still has its send time). The
    completion's times count from the write to an open connection (`Completion.sent_s` after
    `send`), its connect time is `connect_s`. With `outgoing`, the request was made ready and
    written already (`ConnectionPool.fire`): only its answer is awaited here."""
    resp: Response | None = None
    status: int | None = None
    try:
        async with asyncio.timeout(timeout_s):
            if outgoing is not None:
                resp = await pool.complete(outgoing)
            else:
                resp = await pool.post(path, payload)
            status = resp.status
            if not 200 <= status < 300:
                retryable = status == 429 or status >= 500
                # A retried error keeps a shorter prefix: it may be the last of several.
                text = await resp.error_text(200 if retryable else 300)
                raise CallFailed(
                    f"http_{status}",
                    f"HTTP {status}: {text}",
                    status=status,
                    retryable=retryable,
                    retry_after=_retry_after(resp.headers.get("retry-after")),
                )
            if resp.content_type != "text/event-stream":
                completion = await _read_body(resp, parser, cap)
            else:
                completion = await _read_sse(resp, parser, cap)
            completion.sent_s = resp.sent_at - send
            completion.connect_s = resp.connect_s
        if parser.done:
            await _drain(resp)
        return completion
    except CallFailed as exc:
        exc.status = status
        raise
    except orjson.JSONDecodeError:
        raise CallFailed("malformed_response", "response body is not JSON", status=status) from None
    except TimeoutError:
        raise CallFailed(
            "timeout", f"no complete response within {timeout_s:g} s", status=status
        ) from None
    except HttpConnectionError as exc:
        raise CallFailed("connection", str(exc), status=status, retryable=True) from None
    except HttpProtocolError as exc:
        raise CallFailed(exc.kind, str(exc), status=status) from None
    finally:
        if resp is not None:
            resp.release()


async def _read_body(resp: Response, parser: StreamParser, cap: int | None) -> Completion:
    """A non-streaming answer: one chunk, stamped with the arrival of its last bytes."""
    pieces, stamp = [], resp.sent_at
    while (piece := await resp.next_piece(cap)) is not None:
        pieces.append(piece[0])
        stamp = piece[1]
    done = parser.body(orjson.loads(b"".join(pieces)), resp.status, stamp - resp.sent_at)
    done.client_lag_s = time.perf_counter() - stamp
    return done


async def _read_sse(resp: Response, parser: StreamParser, cap: int | None) -> Completion:
    """Split the body into events as bytes arrive; every event of an arrival gets the arrival's
    stamp (taken before any of this ran, `endpoint.wire`).

    Each arrival is processed in the connection's read callback (`Response.consume`), with no
    task switch per chunk; whole arrivals (not line by line) keep its cost to a split. The
    client lag is the longest time from an arrival to the end of its processing.
    """
    clock = time.perf_counter
    start = resp.sent_at
    held = b""
    lag = 0.0
    last = start

    def on_piece(data: bytes, stamp: float) -> bool:
        nonlocal held, lag, last
        last = stamp
        buf = held + data if held else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" in buf:
            now = stamp - start
            *events, buf = buf.split(b"\n\n")
            for event in events:
                if parser.feed(event, now):
                    break
        held = buf
        lag = max(lag, clock() - stamp)
        return parser.done

    await resp.consume(on_piece, cap)
    if held.strip() and not parser.done:
        parser.feed(held, last - start)
    done = parser.finish(resp.status)
    done.client_lag_s = lag
    return done


async def _drain(resp: Response) -> None:
    """Read what is left of a body after [DONE] (the chunked terminator), outside the request
    timeout and within `DRAIN_TIMEOUT_S`, so that the connection goes back to the pool: a hosted
    API would otherwise pay a new TLS handshake inside the next call's TTFT. A body that does
    not end in time only costs its connection, never the finished call."""
    with contextlib.suppress(TimeoutError, HttpConnectionError, HttpProtocolError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in resp.iter_chunks():
                pass


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
