"""`metrale sim`: a deterministic OpenAI-compatible chat endpoint for tests and overhead studies.

It streams `output_tokens` tokens (capped by the request's `max_tokens`) with a fixed time to
first token and inter-token delay, and injects faults at a given rate: HTTP 500, a connection
dropped mid-stream, or a malformed stream chunk. With `itl_s = 0` all chunks leave in one write,
so a run against it measures the harness, not the simulator.

The serving model (`metrale.endpoint.sim_model`, for load tests whose numbers are known in
advance): with `max_running = K` at most K requests hold a slot at once and the rest wait in
arrival order; the first token is due `ttft_s` + `prefill_s_per_token` x the uncached prompt
tokens after a request takes its slot; an LRU prefix cache of `prefix_cache_tokens` reports
`usage.prompt_tokens_details.cached_tokens`; a request with `tools` is answered with a call of
its first tool; `GET /metrics` shows the counters in vLLM's or llama-server's names
(`sim_metrics`). With `token_budget = B` all streams together emit at most B tokens/s (each
token waits for its turn on a shared clock). `/tokenize` (and `/extras/tokenize`,
llama-cpp-python's path) counts prompt tokens the way the simulator's usage does
(`metrale.prefix.message_words`: whitespace-separated words).

Three distinct times per streamed call (for tests that must tell TTFT from header arrival):
the request arrives; `header_delay_s` later the response headers leave; `ttft_s` after arrival
the first token leaves. With `api_key` set, every `/v1` route and `/tokenize` answer 401 unless
the request carries `Authorization: Bearer <api_key>`, as a hosted API does.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from metrale.endpoint.sim_metrics import render
from metrale.endpoint.sim_model import (
    ServingModel,
    argument_pieces,
    wants_tool_call,
)
from metrale.prefix import DEFAULT_BLOCK, message_words

ERROR_KINDS = ("5xx", "drop", "malformed")


@dataclass
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 0
    model: str = "metrale-sim"
    ttft_s: float = 0.0
    itl_s: float = 0.0
    output_tokens: int = 16
    reply: str | None = None
    error_rate: float = 0.0
    error_kinds: tuple[str, ...] = ERROR_KINDS
    usage: bool = True
    seed: int = 0
    prompt_tokens: int | None = None
    max_running: int | None = None
    token_budget: float | None = None
    #: Seconds from arrival to the response headers of a stream (clamped to `ttft_s`): with 0,
    #: headers leave at once, as most servers send them when they accept a request.
    header_delay_s: float = 0.0
    #: When set, requests without `Authorization: Bearer <api_key>` get HTTP 401.
    api_key: str | None = None
    #: Recorded turns (`metrale.endpoint.replay`) served in place of generated tokens.
    replay: list[Any] | None = None
    #: The serving model (`metrale.endpoint.sim_model`): prefill seconds per uncached prompt
    #: token, the prefix cache's size in tokens (0 = no cache) and block size, and after how
    #: many tool results since the last user message a request with `tools` gets text back.
    prefill_s_per_token: float = 0.0
    prefix_cache_tokens: int = 0
    cache_block: int = DEFAULT_BLOCK
    tool_turns: int | None = None
    #: The names of `/metrics` (`metrale.endpoint.sim_metrics`): vllm, llama-server, or none.
    metrics_names: str = "vllm"


@dataclass
class SimStats:
    """What the simulator received and sent, served at `GET /sim/stats` so that a test or a
    user can check metrale's own counts (retries, errors) against the server's."""

    #: chat completion requests received
    requests: int = 0
    #: faults injected, by kind (5xx, drop, malformed)
    errors: dict[str, int] = field(default_factory=dict)
    unauthorized: int = 0


def _tokens(config: SimConfig) -> list[str]:
    if config.reply is not None:
        words = config.reply.split(" ")
        return [w if i == len(words) - 1 else w + " " for i, w in enumerate(words)]
    return [f"tok{i} " for i in range(config.output_tokens)]


class SimServer:
    """The simulator as an aiohttp application; `start()` returns the base URL."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = SimStats()
        self._rng = random.Random(config.seed)
        self._tokens = _tokens(config)
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self.model = ServingModel(
            max_running=config.max_running, ttft_s=config.ttft_s,
            prefill_s_per_token=config.prefill_s_per_token,
            prefix_cache_tokens=config.prefix_cache_tokens, block=config.cache_block,
        )  # fmt: skip
        self._budget_next = 0.0
        self._calls = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/extras/tokenize", self._tokenize)
        if self.config.metrics_names != "none":
            app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        # A deep backlog: a burst of 1,024 connects must not overflow into SYN retries (1 s).
        site = web.TCPSite(self._runner, self.config.host, self.config.port, backlog=4096)
        await site.start()
        addresses = self._runner.addresses
        port = addresses[0][1] if addresses else self.config.port
        self.base_url = f"http://{self.config.host}:{port}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """401 for a missing or wrong bearer token when `api_key` is set; /health stays open."""
        key = self.config.api_key
        authorized = request.headers.get("Authorization") == f"Bearer {key}"
        if key and request.path != "/health" and not authorized:
            self.stats.unauthorized += 1
            return web.json_response(
                {"error": {"message": "invalid or missing API key", "type": "auth"}}, status=401
            )
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _stats(self, request: web.Request) -> web.Response:
        c = self.model.counters
        return web.json_response(
            {
                "requests": self.stats.requests,
                "errors": dict(self.stats.errors),
                "prefix_cache_queries": c.prefix_queries,
                "prefix_cache_hits": c.prefix_hits,
                "prompt_tokens": c.prompt_tokens,
                "generation_tokens": c.generation_tokens,
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        text = render(self.model, self.config.metrics_names, self.config.model)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model, "object": "model"}]}
        )

    def _fault(self) -> str | None:
        if self.config.error_rate <= 0 or self._rng.random() >= self.config.error_rate:
            return None
        return self._rng.choice(self.config.error_kinds)

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM/SGLang (`prompt`), llama.cpp (`content`) and llama-cpp-python (`input`) bodies."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "body is not an object"}}, status=400)
        if isinstance(body.get("messages"), list):
            count = len(message_words(body["messages"]))
        else:
            text = body.get("prompt", body.get("content", body.get("input", "")))
            count = len(str(text).split())
        return web.json_response({"tokens": list(range(count)), "count": count})

    async def _spend_token(self) -> None:
        """Wait for this token's turn on the shared `token_budget` clock (tokens/s)."""
        if not self.config.token_budget:
            return
        now = time.monotonic()
        slot = max(now, self._budget_next)
        self._budget_next = slot + 1.0 / self.config.token_budget
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """Read and check the request, then serve it under the serving model (`sim_model`):
        it waits for a slot, its prefix is looked up, its first token is due after the prefill
        of its uncached tokens."""
        arrived = time.monotonic()  # the TTFT counts from here: reading the body is part of it
        self.stats.requests += 1
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "body is not an object"}}, status=400)
        model = body.get("model")
        if model != self.config.model:
            return web.json_response(
                {"error": {"message": f"model {model!r} not found"}}, status=404
            )
        fault = self._fault()
        if fault:
            self.stats.errors[fault] = self.stats.errors.get(fault, 0) + 1
        if fault == "5xx":
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        words = message_words(body.get("messages"))
        tokens = self._tokens
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        finish = "stop"
        if isinstance(max_tokens, int) and max_tokens < len(tokens):
            tokens, finish = tokens[:max_tokens], "length"
        async with self.model.admitted(words, len(tokens)) as adm:
            # Without a wait for a slot the clock started at arrival; after one, at admission.
            start = arrived if not adm.waited else time.monotonic()
            first_token_at = start + adm.first_token_s
            if self.config.replay is not None:
                from metrale.endpoint.replay import serve_turn

                return await serve_turn(
                    request, body, self.config.replay, model=self.config.model,
                    ttft_s=max(0.0, first_token_at - time.monotonic()), usage=self.config.usage,
                )  # fmt: skip
            usage: dict[str, Any] = {
                "prompt_tokens": self.config.prompt_tokens or adm.prompt_tokens,
                "completion_tokens": len(tokens),
                "total_tokens": (self.config.prompt_tokens or adm.prompt_tokens) + len(tokens),
            }
            if self.model.cache is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": adm.cached_tokens}
            tool = wants_tool_call(body, self.config.tool_turns)
            self._calls += 1
            call_id = f"call_sim_{self._calls}"
            if tool is not None:
                finish = "tool_calls"
            try:
                if not body.get("stream"):
                    return await self._answer(
                        body, tokens, finish, usage, tool, call_id, start, first_token_at
                    )
                return await self._stream(
                    request, body, tokens, finish, usage, tool, call_id, start, first_token_at,
                    fault,
                )  # fmt: skip
            finally:
                self.model.generated(len(tokens))

    async def _answer(
        self,
        body: dict[str, Any],
        tokens: list[str],
        finish: str,
        usage: dict[str, Any],
        tool: dict[str, Any] | None,
        call_id: str,
        start: float,
        first_token_at: float,
    ) -> web.Response:
        """A non-streaming answer, sent when its last token is due."""
        if first_token_at > time.monotonic():
            await _sleep_until(first_token_at)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(tokens)}
        if tool is not None:
            arguments = "".join(argument_pieces(tool, tokens))
            message["content"] = None
            message["tool_calls"] = [_call(call_id, tool, arguments)]
        out: dict[str, Any] = {
            "id": "chatcmpl-sim",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if self.config.usage:
            out["usage"] = usage
        if self.config.itl_s > 0 and len(tokens) > 1:
            await asyncio.sleep(self.config.itl_s * (len(tokens) - 1))
        return web.json_response(out)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        tokens: list[str],
        finish: str,
        usage: dict[str, Any],
        tool: dict[str, Any] | None,
        call_id: str,
        start: float,
        first_token_at: float,
        fault: str | None,
    ) -> web.StreamResponse:
        # Headers and frames are ready before the wait, as a real server sends its headers when
        # it accepts a request: after the wait only the first token's write remains. A
        # `header_delay_s` holds the headers back, so send, headers and first token differ.
        if self.config.header_delay_s > 0:
            await _sleep_until(min(start + self.config.header_delay_s, first_token_at))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        created = int(time.time())
        model = self.config.model
        want_usage = self.config.usage and (body.get("stream_options") or {}).get("include_usage")
        if tool is None:
            frames = [_frame(created, model, {"content": tok}, None) for tok in tokens]
        else:
            pieces = argument_pieces(tool, tokens)
            frames = [
                _frame(created, model, {"tool_calls": [_delta_call(i, call_id, tool, piece)]}, None)
                for i, piece in enumerate(pieces)
            ]
        frames.append(_frame(created, model, {}, finish))
        if want_usage:
            frames.append(_usage_frame(created, model, usage))
        frames.append(b"data: [DONE]\n\n")
        if first_token_at > time.monotonic():
            await _sleep_until(first_token_at)
        if fault == "drop":
            await resp.write(b"".join(frames[: max(1, len(tokens) // 2)]))
            if request.transport is not None:
                request.transport.close()
            return resp
        if fault == "malformed":
            frames.insert(max(1, len(tokens) // 2), b'data: {"choices": [{"delta": \n\n')
        if self.config.itl_s <= 0 and not self.config.token_budget:
            await resp.write(b"".join(frames))
        else:
            last = time.monotonic()
            for i, frame in enumerate(frames):
                if 0 < i < len(tokens) and self.config.itl_s > 0:
                    await _sleep_until(last + self.config.itl_s)
                    last = time.monotonic()
                if i < len(tokens):
                    await self._spend_token()
                await resp.write(frame)
        await resp.write_eof()
        return resp


def _call(call_id: str, fn: dict[str, Any], arguments: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": fn.get("name", ""), "arguments": arguments},
    }


def _delta_call(i: int, call_id: str, fn: dict[str, Any], piece: str) -> dict[str, Any]:
    """A streamed tool call's piece: the first carries its id and name, as OpenAI's do."""
    if i == 0:
        return {"index": 0, **_call(call_id, fn, piece)}
    return {"index": 0, "function": {"arguments": piece}}


async def _sleep_until(deadline: float) -> None:
    """Wake at `deadline` (monotonic) within ~0.1 ms rather than asyncio's ~0.3–1 ms.

    The event loop waits in epoll, whose timeout is whole milliseconds rounded up, so a plain
    `asyncio.sleep` wakes late by up to 1 ms: a bias in every TTFT that the simulator promises.
    Sleep to 1.5 ms short of the deadline, then yield to the loop until it passes.
    """
    remaining = deadline - time.monotonic()
    if remaining > 0.0015:
        await asyncio.sleep(remaining - 0.0015)
    while time.monotonic() < deadline:
        await asyncio.sleep(0)


def _frame(created: int, model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    chunk = {
        "id": "chatcmpl-sim",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _usage_frame(created: int, model: str, usage: dict[str, int]) -> bytes:
    chunk = {
        "id": "chatcmpl-sim",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def serve_forever(config: SimConfig) -> None:
    """Run until cancelled; print the base URL on one line first so a parent can read it."""
    server = SimServer(config)
    url = await server.start()
    print(f"metrale sim listening on {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
