"""Session load and the capacity search end to end: `metrale run serve` against servers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from tests.benchmarks.serve.test_serve_sim import requests, serve
from tests.conftest import run_cli


def by_session(rows: list[dict]) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    out: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for r in rows:
        out.setdefault(r["session"], []).append(r)
    return {k: sorted(v, key=lambda r: r["turn"]) for k, v in out.items()}


def sim_counter(url: str, name: str) -> float:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} on the simulator's /metrics")


def test_64_sessions_of_10_turns_are_640_requests_with_growing_prompts(
    sim_factory, tmp_path: Path
) -> None:
    # A prefix cache large enough for every session: cached tokens are the sim's to report.
    s = sim_factory("--output-tokens", "4", "--prefix-cache-tokens", "10000000")
    result = serve(s.url, tmp_path, "--load", "sessions", "--lanes", "16", "--sessions", "64",
                   "--turns", "10", "--turn-tokens", "30", "--system-tokens", "100",
                   "--tool-time", "exp:0.01", "--max-tokens", "4")  # fmt: skip
    rows = [r for r in requests(tmp_path) if r["phase"] == "measure"]
    assert len(rows) == 640 and all(r["error"] is None for r in rows)
    sessions = by_session(rows)
    assert len(sessions) == 64
    for turns in sessions.values():
        assert [r["turn"] for r in turns] == list(range(1, 11))
        prompts = [r["prompt_tokens"] for r in turns]
        assert all(b > a for a, b in itertools.pairwise(prompts)), prompts
        assert turns[0]["tool_s"] == 0 and all(r["tool_s"] > 0 for r in turns[1:])
        # each turn is sent after the previous ended plus its tool time
        for a, b in itertools.pairwise(turns):
            assert b["send_s"] >= a["end_s"] + b["tool_s"] - 1e-6
    # The cached tokens the sim counted are the records' (no warm-up: every request measured).
    assert sum(r["cached_tokens"] for r in rows) == sim_counter(
        s.url, "vllm:prefix_cache_hits_total"
    )
    probe = 2  # the ignore_eos probe, "Say hi."
    prompts_sent = sum(r["prompt_tokens"] for r in rows) + probe
    assert prompts_sent == sim_counter(s.url, "vllm:prompt_tokens_total")
    for turns in sessions.values():  # turn i+1 finds turn i's whole prompt, in full blocks
        for a, b in itertools.pairwise(turns):
            assert b["cached_tokens"] == a["prompt_tokens"] // 16 * 16
    m = result["metrics"]
    assert m["prefix_cache_efficiency"] == pytest.approx(1.0, abs=0.01)
    assert m["sessions"] == 64 and m["turns_per_session_mean"] == 10
    assert m["requests"] == 640 and m["session_goodput"] == 1.0
    assert m["ttft_ms_p50_turn1"] is not None and m["ttft_ms_p50_turn9_16"] is not None
    assert m["session_wall_s_p50"] > m["session_model_s_mean"] / 10
    levels = json.loads((tmp_path / "levels.json").read_text())
    assert levels["load"] == "sessions" and levels["levels"][0]["lanes"] == 16
    by_turn = levels["levels"][0]["by_turn"]
    assert sorted(by_turn, key=int) == [str(t) for t in range(1, 11)]
    assert all(row["requests"] == 64 and row["ttft_ms_p50"] > 0 for row in by_turn.values())


class Recorder:
    """A chat endpoint that keeps every request body as received and streams a short reply."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.read())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in (
            {"choices": [{"index": 0, "delta": {"content": "ok"}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
        ):  # fmt: skip
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "rec"}]})


@contextlib.contextmanager
def recording_server() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", rec.chat)
    app.router.add_get("/v1/models", rec.models)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", rec
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_a_recorded_session_replayed_twice_sends_identical_bodies(tmp_path: Path) -> None:
    session = {
        "id": "fix",
        "messages": [
            {"role": "system", "content": "You are a shell agent."},
            {"role": "user", "content": "Fix the repository."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": "{\"command\": \"git status\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "On branch master", "tool_s": 0.01},
            {"role": "assistant", "content": "Fixed.", "max_tokens": 9},
        ],
    }  # fmt: skip
    path = tmp_path / "sessions.jsonl"
    path.write_text(json.dumps(session) + "\n")
    sent = []
    for run in ("a", "b"):
        with recording_server() as (url, rec):
            serve(url, tmp_path / run, "--load", "sessions", "--session-source", str(path),
                  "--lanes", "1", "--sessions", "3", "--warmup", "1")  # fmt: skip
        sent.append(rec.bodies)
    first, second = sent
    assert first == second  # byte for byte, in order (one lane)
    chats = [json.loads(b) for b in first if b"Fix the repository" in b]
    assert len(chats) == 8  # 4 sessions (1 warm-up) x 2 turns
    assert chats[1]["messages"][2]["content"] is None and chats[1]["tools"][0]["function"]
    assert chats[1]["max_tokens"] == 9
    # each session opened by its own marker: no two lanes share a cached prefix
    users = {c["messages"][1]["content"] for c in chats}
    assert users == {f"[session {k}] Fix the repository." for k in range(4)}


@pytest.mark.slow
def test_the_search_finds_the_hand_computed_capacity_of_k_slots(
    sim_factory, tmp_path: Path
) -> None:
    """K = 6 slots, each request S0 = 0.1 s to its first token + 7 x D = 0.02 s: S = 0.24 s
    (serve.md, the simulator's serving model). With no tool time, up to K lanes never queue
    (TTFT = S0 = 100 ms); with K + 1 lanes the requests run in rounds of K + 1 where one waits a
    whole S (TTFT = 340 ms): 1/(K+1) > 5% of them, so ttft_p95 <= 220 ms fails. The capacity is
    K lanes; the 120 ms margins either side absorb a loaded machine."""
    k = 6
    s = sim_factory("--max-running", str(k), "--ttft", "0.1", "--itl", "0.02",
                    "--output-tokens", "8")  # fmt: skip
    low, high = 2, 33
    result = serve(s.url, tmp_path, "--load", "sessions", "--sessions", "16", "--turns", "4",
                   "--turn-tokens", "10", "--system-tokens", "10", "--tool-time", "const:0",
                   "--max-tokens", "8", "--search", "lanes", "--search-range", f"{low}:{high}",
                   "--slo", "ttft_p95<=220ms")  # fmt: skip
    levels = json.loads((tmp_path / "levels.json").read_text())
    (tier,) = levels["search"]["tiers"]
    assert abs(tier["boundary"] - k) <= 1, levels["search"]
    assert levels["search"]["levels"] == len(levels["levels"])
    assert len(levels["levels"]) <= math.ceil(math.log2(high - low + 1)) + 3
    assert result["metrics"]["capacity"] == tier["boundary"]
    assert tier["above"] == tier["boundary"] + 1 and tier["request_throughput"] > 0
    assert "ttft_p95<=220ms" in tier["bootstrap"]
    # every level judged the tier; the plot and the HTML page draw attainment against lanes
    assert all("slo" in lv["tiers"] for lv in levels["levels"])
    plot = run_cli(["plot", str(tmp_path), "-o", str(tmp_path / "p.png")], timeout=120)
    assert plot.returncode == 0, plot.stderr
    from metrale.benchmarks.serve.plot import serve_curves

    (panel, *_) = serve_curves(tmp_path)
    assert panel["title"].startswith("SLO attainment") and panel["mark"] == tier["boundary"]


@pytest.mark.slow
def test_the_concurrency_search_finds_k_slots(sim_factory, tmp_path: Path) -> None:
    """The same serving model under a closed loop of C clients: C <= K never waits (TTFT =
    S0 = 0.1 s); C = K + 1 makes one request in K + 1 wait S = 0.24 s, more than ttft_p90
    allows (1/(K+1) = 20% > 10%). Capacity K = 4, found in at most 2 + ceil(log2 15) levels."""
    k = 4
    s = sim_factory("--max-running", str(k), "--ttft", "0.1", "--itl", "0.02",
                    "--output-tokens", "8")  # fmt: skip
    result = serve(s.url, tmp_path, "--requests", "40", "--max-tokens", "8",
                   "--search", "concurrency", "--search-range", "1:16",
                   "--slo", "ttft_p90<=220ms")  # fmt: skip
    levels = json.loads((tmp_path / "levels.json").read_text())
    (tier,) = levels["search"]["tiers"]
    assert abs(tier["boundary"] - k) <= 1, levels["search"]
    assert len(levels["levels"]) <= 2 + math.ceil(math.log2(15))
    assert result["metrics"]["capacity"] == tier["boundary"]
    assert [lv["concurrency"] for lv in levels["levels"]][:2] == [1, 16]
    assert levels["levels"][1]["stopped"].startswith("over-saturated")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--slo", "ttft_p95<=2s,latency_p50<=3"], "declares no metric 'latency_p50'"),
        (["--slo", "gold:ttft_p95<=>2s"], "malformed"),
        (
            [
                "--load",
                "sessions",
                "--search",
                "lanes",
                "--search-range",
                "8:8",
                "--slo",
                "ttft_p95<=2s",
            ],
            "empty",
        ),
        (["--load", "sessions", "--search", "lanes"], "needs at least one SLO tier"),
        (["--search", "lanes", "--slo", "ttft_p95<=2s"], "--load sessions"),
        (["--load", "sessions", "--tool-time", "gauss:1"], "tool_time"),
        (["--load", "sessions", "--session-source", "/nonexistent.jsonl"], "sessions file"),
    ],
)
def test_bad_slo_and_search_are_one_line_and_exit_2(flags: list[str], needle: str) -> None:
    # The target does not answer: a usage error must come before any work touches it.
    proc = run_cli(["run", "serve", "--target", "http://127.0.0.1:9/v1", *flags], timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
