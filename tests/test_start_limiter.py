"""The start limiter: a bound on sandbox starts in flight that adapts to their latency, and the
wait for a slot recorded on each rollout as `setup_wait` (inside setup, shown beside it)."""

from __future__ import annotations

import asyncio

import pytest

from metrale.rollout.limiter import StartLimiter, default_start_limit
from metrale.rollout.pool import Progress, RolloutPlan, run_rollouts
from metrale.rollout.records import RolloutContext
from metrale.rollout.summary import ROLLOUT_METRICS, build_summary, shown_stages


class SlowStart:
    """A runtime whose start takes `start_s` and that counts starts in flight."""

    live = 0
    peak = 0

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s

    async def start(self) -> None:
        SlowStart.live += 1
        SlowStart.peak = max(SlowStart.peak, SlowStart.live)
        try:
            await asyncio.sleep(self.start_s)
        finally:
            SlowStart.live -= 1

    async def stop(self) -> None:
        await asyncio.sleep(0.001)


class Quick:
    async def setup(self, ctx: RolloutContext) -> None: ...

    async def generate(self, ctx: RolloutContext) -> None: ...

    async def score(self, ctx: RolloutContext) -> None:
        ctx.record.reward = 1.0


def run_plan(count: int, start_limit: int | None, start_s: float = 0.02) -> Progress:
    SlowStart.live = SlowStart.peak = 0
    plan = RolloutPlan(
        benchmark="fake", count=count, make_task=lambda i: Quick(),
        make_runtime=lambda i: SlowStart(start_s), runtime_name="fake", start_limit=start_limit,
    )  # fmt: skip
    progress = Progress(keep_records=True)
    asyncio.run(run_rollouts(plan, progress))
    return progress


def test_a_fixed_limit_bounds_starts_in_flight_and_the_wait_is_setup_wait() -> None:
    progress = run_plan(12, start_limit=3)
    assert SlowStart.peak == 3
    waits = sorted(r.setup_wait_s for r in progress.records)  # type: ignore[type-var]
    assert waits[0] < 0.01  # the first three started at once
    assert waits[-1] >= 3 * 0.02 * 0.9  # the last queued behind three rounds of starts
    for r in progress.records:
        assert r.setup_wait_s is not None and r.stages["setup"].duration_s >= r.setup_wait_s
        assert r.stop_s is not None and r.stop_s > 0
    summary = build_summary(progress, ROLLOUT_METRICS, 1.0)
    assert shown_stages(summary) == [
        "setup_wait",
        "setup",
        "generation",
        "scoring",
        "stop",
        "total",
    ]
    assert summary.metrics["setup_wait"] is not None and summary.metrics["stop"] is not None


def test_limit_zero_is_unbounded() -> None:
    run_plan(20, start_limit=0)
    assert SlowStart.peak == 20


def test_the_default_adapts_from_twice_the_cores() -> None:
    progress = run_plan(40, start_limit=None, start_s=0.005)
    assert 1 <= SlowStart.peak <= 8 * default_start_limit()
    assert all(r.setup_wait_s is not None for r in progress.records)


def test_without_a_runtime_nothing_waits_and_no_column_is_shown() -> None:
    plan = RolloutPlan(benchmark="fake", count=3, make_task=lambda i: Quick())
    progress = Progress()
    asyncio.run(run_rollouts(plan, progress))
    assert all(r.setup_wait_s is None and r.stop_s is None for r in progress.records)
    summary = build_summary(progress, ROLLOUT_METRICS, 1.0)
    assert shown_stages(summary) == ["setup", "generation", "scoring", "total"]


def test_slow_starts_shrink_the_limit_and_fast_ones_grow_it() -> None:
    limiter = StartLimiter(16, ceiling=64)
    for _ in range(5):
        limiter._observe(0.01)  # the uncontended cost
    grown = limiter.limit
    assert grown > 16
    for _ in range(30):
        limiter._observe(0.5)  # 50x slower: contention
    assert limiter.limit < grown / 2
    assert limiter.history[0] == 16 and min(limiter.history) == limiter.limit


def test_fifo_and_a_cancelled_waiter_gives_its_slot_on() -> None:
    async def main() -> list[int]:
        limiter = StartLimiter(1, adaptive=False)
        order: list[int] = []
        await limiter.acquire()

        async def take(i: int) -> None:
            await limiter.acquire()
            order.append(i)
            limiter.release(None)

        tasks = [asyncio.create_task(take(i)) for i in range(4)]
        await asyncio.sleep(0.01)
        tasks[1].cancel()
        limiter.release(None)
        await asyncio.gather(*tasks, return_exceptions=True)
        assert limiter.in_flight == 0
        return order

    assert asyncio.run(main()) == [0, 2, 3]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        StartLimiter(0)
