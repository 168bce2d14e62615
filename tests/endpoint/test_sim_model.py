"""The simulator's serving model: slots and queue, prefill linear in the uncached prompt tokens,
the LRU prefix cache and its usage report, tool calls in replies, `/metrics`, and the capacity
formulas of docs/benchmarks/serve.md checked against what a closed loop measures."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metrale.endpoint.sim import SimConfig, SimServer
from metrale.endpoint.sim_model import PrefixCache
from metrale.prefix import ideal_hit_rate, message_words
from tests.conftest import start_sim

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def run_with(
    config: SimConfig, body: Callable[[SimServer, aiohttp.ClientSession, str], Awaitable[Any]]
) -> Any:
    async def main() -> Any:
        server = SimServer(config)
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                return await body(server, session, url)
        finally:
            await server.stop()

    return asyncio.run(main())


async def chat(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    payload = {"model": "metrale-sim", "messages": messages, **extra}
    async with session.post(f"{url}/chat/completions", json=payload) as resp:
        assert resp.status == 200
        data: dict[str, Any] = await resp.json()
        return data


async def stream_chat(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], **extra: Any
) -> tuple[float, list[dict[str, Any]]]:
    """(seconds to the first output chunk, every chunk)."""
    payload = {
        "model": "metrale-sim", "messages": messages, "stream": True,
        "stream_options": {"include_usage": True}, **extra,
    }  # fmt: skip
    sent = time.perf_counter()
    first: float | None = None
    chunks: list[dict[str, Any]] = []
    async with session.post(f"{url}/chat/completions", json=payload) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"]:
                first = time.perf_counter() - sent
            chunks.append(chunk)
    assert first is not None
    return first, chunks


def test_cached_tokens_are_the_leading_full_blocks_already_seen() -> None:
    config = SimConfig(prefix_cache_tokens=10_000, cache_block=16)
    system = {"role": "system", "content": words("s", 40)}

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> list[int]:
        got = []
        for user in ("a b c", "d e f g h", "a b c"):
            out = await chat(session, url, [system, {"role": "user", "content": user}])
            assert out["usage"]["prompt_tokens"] == 40 + len(user.split())
            got.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
        c = server.model.counters
        assert (c.prefix_queries, c.prefix_hits) == (43 + 45 + 43, sum(got))
        return got

    # first: nothing cached; second: the 2 full blocks of the shared 40-word system prompt
    # (block 3 holds s32..s39 plus the user's words, so it differs); third: the same 43 words
    # as the first, whose 2 full blocks are cached (the last 11 words are a partial block)
    assert run_with(config, body) == [0, 32, 32]


def test_the_lru_cache_evicts_the_least_recently_used_blocks() -> None:
    cache = PrefixCache(capacity_tokens=32, block=16)
    a, b = [f"a{i}" for i in range(32)], [f"b{i}" for i in range(32)]
    assert cache.admit(a) == 0
    assert cache.admit(a) == 32
    assert cache.admit(b) == 0  # a's two blocks are evicted to make room
    assert cache.admit(a) == 0
    assert cache.used_tokens == 32
    # a cache of one block keeps only the most recent block: a prompt's first block is gone
    small = PrefixCache(capacity_tokens=16, block=16)
    small.admit(a)
    assert small.admit(a) == 0


def test_without_a_cache_usage_has_no_details_and_nothing_is_cached() -> None:
    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> None:
        for _ in range(2):
            out = await chat(session, url, [{"role": "user", "content": words("w", 40)}])
            assert "prompt_tokens_details" not in out["usage"]
        assert server.model.counters.prefix_hits == 0

    run_with(SimConfig(), body)


def test_prefill_time_is_linear_in_the_uncached_prompt_tokens() -> None:
    # 0.01 s a token: 64 uncached tokens take 0.64 s, the same prompt again (4 blocks cached,
    # 0 left) takes ttft only, and 16 new tokens after a cached 64 take 0.16 s.
    config = SimConfig(ttft_s=0.05, prefill_s_per_token=0.01, prefix_cache_tokens=4096)
    prefix = {"role": "user", "content": words("p", 64)}

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> list[float]:
        first, _ = await stream_chat(session, url, [prefix])
        again, _ = await stream_chat(session, url, [prefix])
        more, _ = await stream_chat(
            session, url, [prefix, {"role": "user", "content": words("q", 16)}]
        )
        return [first, again, more]

    first, again, more = run_with(config, body)
    assert 0.69 <= first < 0.69 + 0.15
    assert 0.05 <= again < 0.05 + 0.1
    assert 0.21 <= more < 0.21 + 0.1


def test_at_most_max_running_requests_are_served_and_the_rest_wait() -> None:
    config = SimConfig(max_running=2, ttft_s=0.3, metrics_names="vllm")

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> str:
        calls = [
            asyncio.create_task(chat(session, url, [{"role": "user", "content": f"q{i}"}]))
            for i in range(5)
        ]
        await asyncio.sleep(0.15)
        async with session.get(url.removesuffix("/v1") + "/metrics") as resp:
            page = await resp.text()
        await asyncio.gather(*calls)
        return page

    page = run_with(config, body)
    assert 'vllm:num_requests_running{model_name="metrale-sim"} 2.0' in page
    assert 'vllm:num_requests_waiting{model_name="metrale-sim"} 3.0' in page


@pytest.mark.parametrize(("k", "clients"), [(2, 2), (2, 4), (3, 9)])
def test_closed_loop_ttft_and_throughput_follow_the_capacity_formulas(k: int, clients: int) -> None:
    """docs/benchmarks/serve.md: S = ttft + p·u + itl·(n−1); with C clients a multiple of K,
    every request waits S·(C/K − 1) and throughput is min(C, K)/S requests/s."""
    ttft, per_token, itl, n, u = 0.1, 0.01, 0.05, 5, 20
    service = ttft + per_token * u + itl * (n - 1)  # 0.5 s: long beside a loaded loop's delays
    config = SimConfig(max_running=k, ttft_s=ttft, prefill_s_per_token=per_token, itl_s=itl,
                       output_tokens=n)  # fmt: skip
    rounds = 2

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> Any:
        ttfts: list[float] = []

        async def client(i: int) -> None:
            for r in range(rounds):
                # distinct prompts of u words: no cache is configured anyway
                t, _ = await stream_chat(
                    session, url, [{"role": "user", "content": words(f"c{i}r{r}x", u)}]
                )
                ttfts.append(t)

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        return ttfts, time.perf_counter() - start

    ttfts, wall = run_with(config, body)
    wait = service * (clients / k - 1)
    expected_ttft = ttft + per_token * u + wait
    # the sim never answers sooner than the formula; a loaded machine only adds (each round's
    # delay carries into the next one's wait, hence the slack). The bounds still tell the
    # formula from its neighbours: one slot fewer than K adds a whole S·C/K(K−1) or more
    # (at (2, 4): 1.8 s against 0.8 s), unqueued requests would take ttft + p·u (0.3 s).
    assert expected_ttft - 0.005 <= statistics.median(ttfts) <= 1.25 * expected_ttft + 0.1
    throughput = clients * rounds / wall
    capacity = min(clients, k) / service  # an upper bound, exactly
    assert 0.6 * capacity <= throughput <= 1.05 * capacity


def test_a_request_with_tools_gets_a_call_of_the_first_tool() -> None:
    config = SimConfig(reply="echo hi", tool_turns=1, prefix_cache_tokens=1000)
    user = {"role": "user", "content": "list the files"}

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> None:
        out = await chat(session, url, [user], tools=[BASH])
        message = out["choices"][0]["message"]
        assert out["choices"][0]["finish_reason"] == "tool_calls"
        assert message["content"] is None
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": "echo hi"}
        # streamed: the pieces join into the same arguments, one chunk per output token
        _, chunks = await stream_chat(session, url, [user], tools=[BASH])
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if d]
        assert len(pieces) == 2
        assert json.loads("".join(pieces)) == {"command": "echo hi"}
        # after one tool result (tool_turns=1) the reply is text; the null content and the
        # tool message are accepted and counted as the prompt's words
        history = [user, message, {"role": "tool", "tool_call_id": call["id"], "content": "a b"}]
        out = await chat(session, url, history, tools=[BASH])
        assert out["choices"][0]["message"]["content"] == "echo hi"
        assert out["usage"]["prompt_tokens"] == len(message_words(history)) == 3 + 4 + 2
        # tool_choice none, or no tools: text
        out = await chat(session, url, [user], tools=[BASH], tool_choice="none")
        assert out["choices"][0]["message"]["content"] == "echo hi"

    run_with(config, body)


@pytest.mark.parametrize(
    ("names", "present", "absent"),
    [
        ("vllm", "vllm:prefix_cache_hits_total", "llamacpp:"),
        ("llama-server", "llamacpp:tokens_predicted_total", "vllm:"),
    ],
)
def test_metrics_page_counts_what_was_served(names: str, present: str, absent: str) -> None:
    config = SimConfig(metrics_names=names, prefix_cache_tokens=1000, output_tokens=3)
    messages = [{"role": "user", "content": words("m", 20)}]

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> dict[str, float]:
        await chat(session, url, messages)
        await chat(session, url, messages)
        async with session.get(url.removesuffix("/v1") + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        assert present in text and absent not in text
        return {
            line.split("{")[0].split(" ")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    values = run_with(config, body)
    if names == "vllm":
        assert values["vllm:prefix_cache_queries_total"] == 40
        assert values["vllm:prefix_cache_hits_total"] == 16
        assert values["vllm:prompt_tokens_total"] == 40
        assert values["vllm:generation_tokens_total"] == 6
        assert values["vllm:num_requests_running"] == 0
    else:
        assert values["llamacpp:prompt_tokens_total"] == 40 - 16  # processed, not cached
        assert values["llamacpp:tokens_predicted_total"] == 6


def test_metrics_none_serves_no_page() -> None:
    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> int:
        async with session.get(url.removesuffix("/v1") + "/metrics") as resp:
            return resp.status

    assert run_with(SimConfig(metrics_names="none"), body) == 404


def test_the_sim_cache_with_room_for_everything_serves_the_ideal_hit_rate() -> None:
    """The simulator and metrale's ideal hit rate share one block rule (`metrale.prefix`)."""
    system = {"role": "system", "content": words("sys", 100)}
    prompts = [[system, {"role": "user", "content": words(f"u{i}_", 7 + i)}] for i in range(10)]

    async def body(server: SimServer, session: aiohttp.ClientSession, url: str) -> float:
        for messages in prompts:
            await chat(session, url, messages)
        c = server.model.counters
        return c.prefix_hits / c.prefix_queries

    server_rate = run_with(SimConfig(prefix_cache_tokens=100_000), body)
    ideal = ideal_hit_rate(message_words(p) for p in prompts)
    assert ideal is not None and ideal > 0.5
    assert server_rate == pytest.approx(ideal, abs=1e-12)


def test_the_command_line_sets_the_serving_model() -> None:
    with start_sim(
        "--prefix-cache-tokens", "64", "--cache-block", "8", "--metrics", "llama-server",
        "--tool-turns", "0",
    ) as sim:  # fmt: skip
        payload = json.dumps({
            "model": "metrale-sim", "tools": [BASH],
            "messages": [{"role": "user", "content": words("w", 20)}],
        }).encode()  # fmt: skip
        outs = []
        for _ in range(2):
            request = urllib.request.Request(f"{sim.url}/chat/completions", data=payload)
            with urllib.request.urlopen(request, timeout=30) as resp:
                outs.append(json.loads(resp.read()))
        # blocks of 8: 16 of the 20 words cached the second time; tool_turns 0: text replies
        assert [o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in outs] == [0, 16]
        assert outs[1]["choices"][0]["message"]["content"].startswith("tok0")
        with urllib.request.urlopen(sim.url.removesuffix("/v1") + "/metrics", timeout=30) as resp:
            assert b"llamacpp:prompt_tokens_total 24.0" in resp.read()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--cache-block", "0"), ("--prefix-cache-tokens", "-1"), ("--metrics", "tgi")],
)
def test_bad_serving_model_flags_are_one_line_usage_errors(flag: str, value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "metrale", "sim", "--port", "0", flag, value],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and flag in proc.stderr


@pytest.mark.parametrize("load", [0.8, 2.0])
def test_open_loop_waits_only_past_k_over_s(load: float) -> None:
    """docs/benchmarks/serve.md: at a constant rate λ ≤ K/S no request waits (TTFT = S0 + P·u);
    past K/S the queue grows with every arrival."""
    ttft, per_token, itl, n, u, k = 0.05, 0.005, 0.05, 4, 10, 2
    service = ttft + per_token * u + itl * (n - 1)  # 0.25 s: capacity K/S = 8 req/s
    rate = load * k / service
    config = SimConfig(max_running=k, ttft_s=ttft, prefill_s_per_token=per_token, itl_s=itl,
                       output_tokens=n)  # fmt: skip

    async def body(
        server: SimServer, session: aiohttp.ClientSession, url: str
    ) -> list[tuple[float, float]]:
        start = time.perf_counter()

        async def one(i: int) -> tuple[float, float]:
            await asyncio.sleep(i / rate)
            sent = time.perf_counter()
            t, _ = await stream_chat(
                session, url, [{"role": "user", "content": words(f"o{i}x", u)}]
            )
            return t, sent + t - start

        return list(await asyncio.gather(*(one(i) for i in range(16))))

    got = run_with(config, body)
    ttfts = [t for t, _ in got]
    no_wait = ttft + per_token * u
    # D/D/K: request i starts at its arrival i/λ or when a slot frees, ⌊i/K⌋·S after the first;
    # its first token no_wait later. Neither comes sooner on a loaded machine, only later.
    due = [max(i / rate, (i // k) * service) + no_wait for i in range(16)]
    assert all(at >= d - 0.01 for (_, at), d in zip(got, due, strict=True))
    if load < 1:
        assert due == [i / rate + no_wait for i in range(16)]  # nobody waits
        assert statistics.median(ttfts) < no_wait + 0.1
    else:
        # the 16th arrives 15/λ = 0.94 s in and starts at 7·S = 1.75 s: a 0.81 s wait
        assert due[-1] - 15 / rate - no_wait == pytest.approx(0.8125)
        assert ttfts[-1] > no_wait + 0.5


def test_metrales_agent_loop_runs_live_against_the_sim(tmp_path: Path) -> None:
    """The tool-call rule lets a live agent run: the sim's reply text becomes the bash tool's
    command, its output goes back as a tool message, and after `--tool-turns` results the sim
    answers text and the loop ends."""
    from metrale.agent import Agent, AgentConfig
    from metrale.endpoint.client import ChatClient, Target
    from metrale.runtime import configs

    marker = tmp_path / "ran"

    async def go() -> Any:
        runtime = configs.create_runtime(configs.runtime_config("subprocess"))
        await runtime.start()
        try:
            target = Target(base_url=sim.url, model="metrale-sim")
            async with ChatClient(target) as client:
                agent = Agent(client, runtime, AgentConfig(max_turns=5))
                return await agent.run("make the marker"), agent.messages
        finally:
            await runtime.stop()

    with start_sim("--reply", f"touch {marker} && echo done", "--tool-turns", "2") as sim:
        stats, messages = asyncio.run(go())
    assert marker.exists()  # the command the sim's call carried really ran
    assert stats.turns == 3 and stats.tool_calls == 2  # two calls, then a text answer
    tool_results = [m for m in messages if m.get("role") == "tool"]
    assert len(tool_results) == 2 and "done" in tool_results[0]["content"]
