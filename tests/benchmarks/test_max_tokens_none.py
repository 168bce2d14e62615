"""`--max-tokens none`: every benchmark that calls a model accepts it, and its calls then carry
no `max_tokens` (the server's own limit applies), while a number is still sent as given."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metrale import runner
from metrale.agent import Agent
from metrale.endpoint.client import ChatClient, Target
from metrale.plugin import get_benchmark
from metrale.plugin.params import UNBOUNDED_TOKENS_RULE
from tests.test_agent import FakeRuntime

MODEL_BENCHMARKS = ["gsm8k", "serve", "agentic_webserver", "terminal_bench"]


class Recorder:
    """A minimal OpenAI-compatible server that keeps every chat body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        text = "The answer is 4.\n#### 4"
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in (
            {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage},
        ):
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def serving(recorder: Recorder) -> AsyncIterator[str]:
    app_runner = web.AppRunner(recorder.app(), access_log=None)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    port = app_runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await app_runner.cleanup()


async def run_against(recorder: Recorder, benchmark: str, params: dict[str, object], out: Path):  # type: ignore[no-untyped-def]
    async for url in serving(recorder):
        request = runner.RunRequest(
            benchmark=benchmark,
            params=params,
            target=Target(base_url=url, model="m"),
            out=out,
            preflight=False,
            progress=None,
        )
        return await runner.run(request)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("benchmark", MODEL_BENCHMARKS)
def test_every_model_benchmark_accepts_none_and_says_what_it_means(benchmark: str) -> None:
    bench = get_benchmark(benchmark)()
    assert bench.configure({"max_tokens": "none"})["max_tokens"] is None
    assert bench.configure({"max_tokens": "12"})["max_tokens"] == 12
    spec = next(s for s in bench.parameters() if s.name == "max_tokens")
    assert UNBOUNDED_TOKENS_RULE in spec.help and spec.describe_type().endswith("or none")


def test_terminal_bench_hands_none_to_its_agent() -> None:
    bench = get_benchmark("terminal_bench")()
    bench.configure({"max_tokens": "none"})
    assert bench.task_run.agent_config.max_tokens is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("given", "sent"), [("none", None), ("7", 7)])
def test_gsm8k_sends_no_cap_for_none(tmp_path: Path, given: str, sent: int | None) -> None:
    recorder = Recorder()
    params = {"rollouts": 2, "max_tokens": given}
    outcome = asyncio.run(run_against(recorder, "gsm8k", params, tmp_path))
    assert outcome.result.metrics["errors"] == 0, outcome.result.error
    assert len(recorder.bodies) == 2
    assert all(b.get("max_tokens") == sent for b in recorder.bodies)
    assert all(("max_tokens" in b) == (sent is not None) for b in recorder.bodies)


@pytest.mark.parametrize(("given", "sent"), [("none", None), ("5", 5)])
def test_serve_sends_no_cap_for_none(tmp_path: Path, given: str, sent: int | None) -> None:
    recorder = Recorder()
    params = {"concurrency": 2, "requests": 4, "input_tokens": 8, "max_tokens": given}
    outcome = asyncio.run(run_against(recorder, "serve", params, tmp_path))
    assert outcome.result.metrics["requests"] == 4 and outcome.result.metrics["errors"] == 0
    # the one probe of ignore_eos asks for 2 tokens whatever the cap; the measured requests:
    measured = [b for b in recorder.bodies if b["messages"][-1]["content"] != "Say hi."]
    assert len(measured) == 4
    assert all(("max_tokens" in b) == (sent is not None) for b in measured)
    assert all(b.get("max_tokens") == sent for b in measured)


@pytest.mark.parametrize(("given", "sent"), [(None, None), (9, 9)])
def test_the_agent_of_the_agentic_benchmarks_sends_no_cap_for_none(
    tmp_path: Path, given: int | None, sent: int | None
) -> None:
    bench = get_benchmark("agentic_webserver")()
    values = bench.configure({"max_tokens": "none" if given is None else str(given)})
    recorder = Recorder()

    async def go() -> None:
        from metrale.agent import AgentConfig

        async for url in serving(recorder):
            async with ChatClient(Target(base_url=url, model="m")) as client:
                config = AgentConfig(max_turns=1, max_tokens=values["max_tokens"])
                agent = Agent(client, FakeRuntime(), config, transcript=tmp_path / "t.jsonl")  # type: ignore[arg-type]
                await agent.run("say hi")

    asyncio.run(go())
    assert recorder.bodies
    assert all(("max_tokens" in b) == (sent is not None) for b in recorder.bodies)
    assert all(b.get("max_tokens") == sent for b in recorder.bodies)
