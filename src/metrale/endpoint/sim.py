"""`metrale sim`: a deterministic OpenAI-compatible chat endpoint for tests and overhead studies.

It streams `output_tokens` tokens (capped by the request's `max_tokens`) with a fixed time to
first token and inter-token delay, and injects faults at a given rate: HTTP 500, a connection
dropped mid-stream, or a malformed stream chunk. With `itl_s = 0` all chunks leave in one write,
so a run against it measures the harness, not the simulator.

Capacity model (for load tests whose knee is known in advance): with `max_running = N` at most N
requests are served at once and the rest wait in arrival order before their TTFT starts; with
`token_budget = B` all streams together emit at most B tokens/s (each token waits for its turn
on a shared clock). `/tokenize` (and `/extras/tokenize`, llama-cpp-python's path) counts prompt
tokens the way the simulator's usage does: whitespace-separated words.

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
        self._slots = asyncio.Semaphore(config.max_running) if config.max_running else None
        self._budget_next = 0.0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/extras/tokenize", self._tokenize)
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
        return web.json_response(
            {"requests": self.stats.requests, "errors": dict(self.stats.errors)}
        )

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
            count = _count_prompt(body["messages"])
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
        """The capacity model's queue: at most `max_running` requests are served at once."""
        if self._slots is None:
            return await self._serve_chat(request)
        async with self._slots:
            return await self._serve_chat(request)

    async def _serve_chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()  # the TTFT counts from here: reading the body is part of it
        self.stats.requests += 1
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
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
        if self.config.replay is not None:
            from metrale.endpoint.replay import serve_turn

            return await serve_turn(
                request, body, self.config.replay, model=self.config.model,
                ttft_s=self.config.ttft_s, usage=self.config.usage,
            )  # fmt: skip
        tokens = self._tokens
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        finish = "stop"
        if isinstance(max_tokens, int) and max_tokens < len(tokens):
            tokens, finish = tokens[:max_tokens], "length"
        prompt_tokens = self.config.prompt_tokens or _count_prompt(body.get("messages"))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        }
        created = int(time.time())
        if not body.get("stream"):
            if self.config.ttft_s > 0:
                await _sleep_until(arrived + self.config.ttft_s)
            out = {
                "id": "chatcmpl-sim",
                "object": "chat.completion",
                "created": created,
                "model": self.config.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(tokens)},
                        "finish_reason": finish,
                    }
                ],
            }
            if self.config.usage:
                out["usage"] = usage
            if self.config.itl_s > 0 and len(tokens) > 1:
                await asyncio.sleep(self.config.itl_s * (len(tokens) - 1))
            return web.json_response(out)
        # Headers and frames are ready before the wait, as a real server sends its headers when
        # it accepts a request: after the wait only the first token's write remains. A
        # `header_delay_s` holds the headers back, so send, headers and first token differ.
        if self.config.header_delay_s > 0:
            await _sleep_until(arrived + min(self.config.header_delay_s, self.config.ttft_s))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        want_usage = self.config.usage and (body.get("stream_options") or {}).get("include_usage")
        frames = [_frame(created, self.config.model, {"content": tok}, None) for tok in tokens]
        frames.append(_frame(created, self.config.model, {}, finish))
        if want_usage:
            frames.append(_usage_frame(created, self.config.model, usage))
        frames.append(b"data: [DONE]\n\n")
        if self.config.ttft_s > 0:
            await _sleep_until(arrived + self.config.ttft_s)
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


def _count_prompt(messages: object) -> int:
    """Whitespace-separated words of every message: a stable stand-in for a tokenizer."""
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


def _frame(created: int, model: str, delta: dict[str, str], finish: str | None) -> bytes:
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
