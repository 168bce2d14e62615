"""The serve benchmark's lean streaming client: one aiohttp session, bytes timed as they arrive.

`endpoint.client.ChatClient` retries, accumulates text and builds a pydantic record per call:
right for rollouts, too much per request at thousands of requests a second. This client sends a
pre-encoded body, reads the response in the pieces the socket delivers, stamps each piece with
`time.perf_counter()` once, and parses only the `data:` events, keeping no text. It never
retries: a retry would change the load being measured; a failed request is recorded as one.
The definitions it fills in (TTFT, chunk, output tokens) are those of `serve.metrics`.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from metrale.benchmarks.serve.metrics import RequestRecord, spread_tokens
from metrale.endpoint.client import Target


class StreamClient:
    """`async with StreamClient(target) as c: await c.send(body, record, t0)`."""

    def __init__(self, target: Target, timeout_s: float = 300.0, api: str = "chat") -> None:
        self.target = target
        self.timeout_s = timeout_s
        # chat: /chat/completions (delta.content); completions: /completions (choices[].text).
        self.url = target.base_url + ("/chat/completions" if api == "chat" else "/completions")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamClient:
        headers = {"Content-Type": "application/json"}
        if self.target.api_key:
            headers["Authorization"] = f"Bearer {self.target.api_key}"
        # No pool limit: the load generator is the only bound on requests in flight.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=False)
        self._session = aiohttp.ClientSession(
            headers=headers,
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("StreamClient used outside 'async with'")
        return self._session

    async def send(self, body: bytes, record: RequestRecord, t0: float) -> None:
        """Send one streaming chat request and fill `record`; failures go in `record.error`."""
        clock = time.perf_counter
        send = clock()
        record.send_s = send - t0
        record.started_at = time.time()
        try:
            async with self.session.post(self.url, data=body) as resp:
                record.status = resp.status
                if resp.status != 200:
                    text = (await resp.text())[:200].replace("\n", " ")
                    record.error = f"http_{resp.status}: {text}"
                elif resp.content_type != "text/event-stream":
                    _read_body(await resp.json(content_type=None), record)
                    record.ttft_s = record.e2e_s = clock() - send
                    record.chunk_times_s = [record.ttft_s]
                else:
                    await _read_events(resp, record, send)
        except TimeoutError:
            record.error = f"timeout: no complete response within {self.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            record.error = f"connection: {type(exc).__name__}: {exc}"
        except _StreamError as exc:
            record.error = str(exc)
        except Exception as exc:  # any other surprise is one failed request, not a failed run
            record.error = f"client: {type(exc).__name__}: {exc}"
        record.end_s = clock() - t0


class _StreamError(Exception):
    pass


async def _read_events(resp: aiohttp.ClientResponse, record: RequestRecord, send: float) -> None:
    """Parse the SSE stream: every piece the socket delivers is stamped once, on arrival."""
    clock = time.perf_counter
    loads = orjson.loads
    times: list[float] = []
    cumulative: list[int] = []
    usage: dict[str, Any] | None = None
    ttfc: float | None = None
    reasoning = 0
    finish: str | None = None
    done = False
    pending = b""
    now = last_event = 0.0
    async for piece in resp.content.iter_any():
        now = clock() - send
        pending += piece
        if b"\n" not in piece:
            continue
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            last_event = now
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            try:
                event = loads(data)
            except ValueError:
                raise _StreamError(f"malformed_stream: chunk is not JSON: {data[:60]!r}") from None
            if not isinstance(event, dict):
                raise _StreamError(f"malformed_stream: chunk is not an object: {data[:60]!r}")
            if "error" in event:
                raise _StreamError(f"stream_error: {str(event['error'])[:200]}")
            chunk_usage = event.get("usage")
            choices = event.get("choices")
            if choices:
                choice = choices[0]
                delta = choice.get("delta") or {}
                if delta.get("content") or choice.get("text"):
                    times.append(now)
                    if ttfc is None:
                        ttfc = now
                    if chunk_usage:
                        cumulative.append(chunk_usage.get("completion_tokens") or 0)
                elif (
                    delta.get("reasoning_content")
                    or delta.get("reasoning")
                    or delta.get("tool_calls")
                ):
                    times.append(now)
                    reasoning += 1
                    if chunk_usage:
                        cumulative.append(chunk_usage.get("completion_tokens") or 0)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
            if chunk_usage:
                usage = chunk_usage
    if not done and finish is None:
        raise _StreamError("incomplete: stream ended before [DONE] or a finish_reason")
    # E2E ends at the last event ([DONE]), as the definition says; what follows is transport
    # (the chunked body's end came 0.1-1 ms later on llama-cpp-python in the agreement runs).
    record.e2e_s = last_event
    record.chunk_times_s = times
    record.ttft_s = times[0] if times else None
    record.ttfc_s = ttfc
    record.reasoning_chunks = reasoning
    record.finish_reason = finish
    if usage and usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.prompt_tokens = usage.get("prompt_tokens")
        record.token_source = "usage"
    else:
        record.output_tokens = len(times)
        record.token_source = "counted"
    record.chunk_tokens = spread_tokens(len(times), record.output_tokens, cumulative)
    if record.ttft_s is None:
        record.error = "no_output: the stream carried no output chunk"


def _read_body(data: Any, record: RequestRecord) -> None:
    """A non-streaming answer (a server that ignores `stream`): one chunk at the end."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise _StreamError("malformed_response: response has no 'choices' list")
    usage = data.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.prompt_tokens = usage.get("prompt_tokens")
        record.token_source = "usage"
    else:
        record.output_tokens = 1
        record.token_source = "counted"
    if data["choices"]:
        record.finish_reason = data["choices"][0].get("finish_reason")
    record.chunk_tokens = [float(record.output_tokens)]
