"""The serve benchmark's load client: the endpoint layer's one HTTP/SSE path, without retries.

It sends through the same keep-alive pool (`endpoint.http`) and reads through the same parser
(`endpoint.stream.exchange`) as the chat client of rollouts, so TTFT, E2E, chunk times and the
token-source rule are those of `endpoint.stream`, defined once. What it adds is serve's own:
bodies encoded once before the load starts (`prepare`), each request's bytes made ready
before it is due and written without a wait when it is (`launch`), no text kept, a lean
per-request `RequestRecord`, and **no retries**: a retry would change the load being
measured, so a failed request is recorded as one (`error` = "kind: message", the kinds of
`endpoint.stream`).

It honours the run-wide `ClientOptions` as the chat client does: `request_timeout_s` bounds
each request, `stream=False` (`--no-stream`) sends non-streaming requests (TTFT = E2E, one
chunk), `response_cap` bounds each response body (`response_too_large`). `retries` does not
apply here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.endpoint.client import ClientOptions, Target
from metrale.endpoint.http import ConnectionPool, Outgoing
from metrale.endpoint.stream import CallFailed, Completion, StreamParser, exchange

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request body, encoded once, with its response-size cap."""

    body: bytes
    cap: int | None


class StreamClient:
    """`async with StreamClient(target, options) as c: await c.send(c.prepare(b), record, t0)`."""

    def __init__(
        self, target: Target, options: ClientOptions | None = None, api: str = "chat"
    ) -> None:
        self.target = target
        self.options = options or ClientOptions()
        # chat: /chat/completions (delta.content); completions: /completions (choices[].text).
        self.path = "/chat/completions" if api == "chat" else "/completions"
        self._pool: ConnectionPool | None = None

    async def __aenter__(self) -> StreamClient:
        headers = {"Content-Type": "application/json"}
        if self.target.api_key:
            headers["Authorization"] = f"Bearer {self.target.api_key}"
        # Unbounded pool: the load generator is the only bound on requests in flight.
        self._pool = ConnectionPool(self.target.base_url, headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> ConnectionPool:
        """The connection pool, for the benchmark's other calls to the target (`/tokenize`)."""
        if self._pool is None:
            raise RuntimeError("StreamClient used outside 'async with'")
        return self._pool

    def prepare(self, body: dict[str, Any]) -> PreparedRequest:
        """Encode a request body once: streaming fields per `options.stream`, cap per
        `options.response_cap(max_tokens)`."""
        body = dict(body)
        body.pop("stream_options", None)
        if self.options.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        else:
            body["stream"] = False
        max_tokens = body.get("max_tokens")
        cap = self.options.response_cap(max_tokens if isinstance(max_tokens, int) else None)
        return PreparedRequest(orjson.dumps(body), cap)

    def launch(self, request: PreparedRequest, record: RequestRecord, t0: float) -> Launch:
        """`request` made ready (its bytes) before it is due: `fire()` writes it at once,
        `finish()` reads the answer into `record`."""
        return Launch(self, request, record, t0, self.pool.outgoing(self.path, request.body))

    async def send(
        self,
        request: PreparedRequest,
        record: RequestRecord,
        t0: float,
        out: Outgoing | None = None,
        keep_text: bool = False,
    ) -> Completion | None:
        """Send one request (`out`: made ready and fired already) and fill `record`; failures
        go in `record.error`, never raised. Returns what the response said (with its text and
        tool calls when `keep_text`: a live session's agent reads them), or None when it
        failed."""
        pool = self.pool
        if out is None:
            out = pool.outgoing(self.path, request.body)
            pool.fire(out)
        send = out.handed_at
        record.send_s = send - t0
        record.started_at = time.time() - (time.perf_counter() - send)
        parser = StreamParser(keep_text=keep_text, keep_times=True)
        done: Completion | None = None
        try:
            done = await exchange(
                pool, self.path, request.body, send, parser,
                timeout_s=self.options.request_timeout_s, cap=request.cap, outgoing=out,
            )  # fmt: skip
        except CallFailed as exc:
            record.status = exc.status
            record.error = f"{exc.kind}: {exc}"
        except Exception as exc:  # any other surprise is one failed request, not a failed run
            logger.debug("request %d failed in the client", record.index, exc_info=exc)
            record.error = f"client: {type(exc).__name__}: {exc}"
            done = None
        else:
            record.status = done.status
            record.sent_s = record.send_s + done.sent_s
            record.connect_s = done.connect_s
            record.client_lag_s = done.client_lag_s
            record.ttft_s = done.ttft_s
            record.ttfc_s = done.ttfc_s
            record.e2e_s = done.e2e_s
            record.chunk_times_s = done.chunk_times_s or []
            record.chunk_tokens = done.chunk_tokens()
            record.reasoning_chunks = done.reasoning_chunks
            record.prompt_tokens = done.prompt_tokens
            record.cached_tokens = done.cached_tokens
            record.output_tokens = done.completion_tokens
            record.token_source = done.token_source
            record.finish_reason = done.finish_reason
            if done.ttft_s is None:
                record.error = "no_output: the response carried no output chunk"
        record.end_s = time.perf_counter() - t0
        return done if record.error is None else None


class Launch:
    """One request of serve's load made ready before it is due (`StreamClient.launch`): the
    load generator `fire`s a wave of them back to back, then awaits each one's `finish`."""

    __slots__ = ("client", "out", "record", "request", "t0")

    def __init__(
        self,
        client: StreamClient,
        request: PreparedRequest,
        record: RequestRecord,
        t0: float,
        out: Outgoing,
    ) -> None:
        self.client, self.request, self.record, self.t0, self.out = client, request, record, t0, out

    def fire(self) -> None:
        self.client.pool.fire(self.out)

    async def finish(self) -> None:
        if not self.out.handed_at:
            self.fire()
        await self.client.send(self.request, self.record, self.t0, self.out)
