"""Prefix-cache efficiency: the ideal hit rate metrale computes from the prompts it sent, beside
the server's own (usage `cached_tokens`), run in-process against a real `metrale sim` whose
prefix cache is large enough for everything."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from metrale import runner
from metrale.benchmarks.serve.metrics import RequestRecord, prefix_rates
from metrale.endpoint.client import Target
from metrale.errors import UsageError
from metrale.prefix import IdealPrefixCache, ideal_hit_rate
from tests.conftest import start_sim


def run_serve(url: str, out: Path, **params: Any) -> dict[str, Any]:
    request = runner.RunRequest(
        benchmark="serve",
        params={"ignore_eos": False, **params},
        target=Target(base_url=url, model="metrale-sim"),
        out=out,
        preflight=False,
        progress=None,
    )
    asyncio.run(runner.run(request))
    result: dict[str, Any] = json.loads((out / "result.json").read_text())["result"]
    return result


def sim_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/stats", timeout=30) as resp:
        stats: dict[str, Any] = json.loads(resp.read())
        return stats


@pytest.mark.parametrize(("shared", "own", "concurrency"), [(200, 20, 4), (37, 50, 1)])
def test_a_cache_big_enough_for_everything_is_fully_efficient(
    tmp_path: Path, shared: int, own: int, concurrency: int
) -> None:
    with start_sim("--prefix-cache-tokens", "1000000", "--output-tokens", "4") as sim:
        m = run_serve(
            sim.url, tmp_path / "run", shared_prefix_tokens=shared, input_tokens=own,
            num_prompts=10, requests=30, concurrency=concurrency, max_tokens=4,
        )["metrics"]  # fmt: skip
        stats = sim_stats(sim.url)
    assert m["errors"] == 0
    # the reported server hit rate is the sim's own counters (every chat request was measured)
    assert m["prefix_hit_rate_server"] == pytest.approx(
        stats["prefix_cache_hits"] / stats["prefix_cache_queries"], abs=1e-12
    )
    assert m["prefix_hit_rate_ideal"] > 0.3
    assert m["prefix_cache_efficiency"] == pytest.approx(1.0, abs=0.01)


def test_a_cache_too_small_is_less_than_ideal(tmp_path: Path) -> None:
    # one 16-token block of cache for 200-token shared prefixes: the LRU keeps only the last
    # block stored, never a prompt's first, so nothing hits
    with start_sim("--prefix-cache-tokens", "16") as sim:
        m = run_serve(sim.url, tmp_path / "run", shared_prefix_tokens=200, input_tokens=20,
                      num_prompts=5, requests=10, concurrency=1)["metrics"]  # fmt: skip
    assert m["prefix_hit_rate_server"] == 0.0
    assert m["prefix_hit_rate_ideal"] > 0.5
    assert m["prefix_cache_efficiency"] == 0.0


def test_without_cached_tokens_in_usage_the_server_rate_is_absent(tmp_path: Path) -> None:
    with start_sim() as sim:  # no cache configured: usage has no prompt_tokens_details
        m = run_serve(sim.url, tmp_path / "run", shared_prefix_tokens=32, num_prompts=4,
                      input_tokens=8, requests=8, concurrency=2)["metrics"]  # fmt: skip
    assert m["prefix_hit_rate_server"] is None and m["prefix_cache_efficiency"] is None
    # 4 distinct prompts of 32 + 8 words sent twice each: the first has nothing cached, the next
    # three their 2 shared blocks, the repeats all 2 full blocks of 40 words
    assert m["prefix_hit_rate_ideal"] == pytest.approx((3 * 32 + 4 * 32) / (8 * 40))


def test_shared_prefix_is_for_synthetic_prompts_only(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    with pytest.raises(UsageError, match="shared-prefix-tokens"):
        runner.prepare(runner.RunRequest(
            benchmark="serve", params={"shared_prefix_tokens": 8, "prompts": str(prompts)},
            target=None,
        ))  # fmt: skip


def test_rates_are_sums_over_requests_not_means_of_ratios() -> None:
    def rec(cached: int | None, prompt: int, ideal: int, words: int) -> RequestRecord:
        return RequestRecord(level=0, index=0, phase="measure", intended_s=0, ready_s=0,
                             send_s=0, e2e_s=1, cached_tokens=cached, prompt_tokens=prompt,
                             ideal_cached_tokens=ideal, ideal_prompt_tokens=words)  # fmt: skip

    rates = prefix_rates([rec(0, 100, 0, 100), rec(90, 100, 96, 100), rec(None, 50, 0, 50)])
    assert rates["prefix_hit_rate_server"] == pytest.approx(90 / 200)
    assert rates["prefix_hit_rate_ideal"] == pytest.approx(96 / 250)
    assert rates["prefix_cache_efficiency"] == pytest.approx((90 / 200) / (96 / 250))


def test_the_ideal_cache_counts_whole_leading_blocks_seen_before() -> None:
    cache = IdealPrefixCache(block=4)
    assert cache.add(list("abcdefghij")) == 0  # blocks abcd, efgh stored; "ij" partial
    assert cache.add(list("abcdefgXij")) == 4  # the second block differs
    assert cache.add(list("abcdefghijkl")) == 8  # ijkl is new
    assert cache.add(list("Xbcdefgh")) == 0  # a block is named by its whole prefix
    assert cache.hit_rate == pytest.approx(12 / 40)
    assert ideal_hit_rate([list("abcdefgh")] * 3, block=4) == pytest.approx(16 / 24)
