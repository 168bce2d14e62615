"""The start limiter: a bound on sandbox starts in flight that adapts to their latency, and the
wait for a slot recorded on each rollout as `setup_wait` (inside setup, shown beside it)."""

from __future__ import annotations

import asyncio

import pytest

from metrale.plugin import shown_stages
from metrale.rollout.limiter import StartLimiter, default_start_limit
from metrale.rollout.pool import Progress, RolloutPlan, run_rollouts
from metrale.rollout.records import RolloutContext
from metrale.rollout.summary import ROLLOUT_METRICS, build_summary


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


def test_the_gradient_rule_on_literal_latencies() -> None:
    """Worked by hand from the module docstring's rule (tolerance 2, smoothing 0.2):
    recent' = 0.8 recent + 0.2 x, gradient = clamp(2 shortest / recent', 0.5, 1),
    limit' = min(ceiling, 0.8 limit + 0.2 (limit gradient + sqrt(limit)))."""
    limiter = StartLimiter(10, ceiling=12)
    limits = []
    for latency in (0.1, 0.1, 0.1, 0.1, 0.1, 0.7, 2.0, 5.0):
        limiter._observe(latency)
        limits.append(limiter._limit)
    assert limits == pytest.approx(
        # 10 -> 0.8*10 + 0.2*(10 + sqrt 10) = 10.632456, ...; 12 is the ceiling. At 0.7 the
        # recent average is 0.22: gradient 2*0.1/0.22 is capped at 1, the limit holds.
        # At 2.0: recent 0.576, gradient 0.347 -> 0.5: 0.8*12 + 0.2*(6 + sqrt 12) = 11.49282.
        # At 5.0: recent 1.4608, gradient 0.137 -> 0.5: 11.02156.
        [10.632456, 11.284604, 11.956456, 12.0, 12.0, 12.0, 11.49282, 11.02156],
        abs=1e-5,
    )
    # The limit read back after each change, each value once.
    assert limiter.history == [10, 11, 12, 11]


def test_tolerance_decides_when_a_slower_start_is_contention() -> None:
    limiter = StartLimiter(12, ceiling=12)
    for latency in (0.1, 0.7):
        limiter._observe(latency)
    # Recent average 0.22 is within the default tolerance, 2x the shortest 0.1: no change ...
    assert limiter._limit == 12.0
    strict = StartLimiter(12, ceiling=12, tolerance=1.0)
    for latency in (0.1, 0.7):
        strict._observe(latency)
    # ... but not within 1x: gradient 0.1 / 0.22 -> 0.5, limit 0.8*12 + 0.2*(6 + sqrt 12).
    assert strict._limit == pytest.approx(11.49282, abs=1e-5)


def test_a_limit_of_one_stays_one_and_a_zero_latency_is_taken() -> None:
    limiter = StartLimiter(1, ceiling=4)
    limiter._observe(0.0)  # a start faster than the clock's resolution
    limiter._observe(1.0)
    assert limiter.limit == 1 and limiter.history == [1]


def test_the_default_limit_and_ceiling_follow_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert default_start_limit() == 6
    assert StartLimiter().ceiling == 24 and StartLimiter().limit == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: taken as one core
    assert default_start_limit() == 2 and StartLimiter().ceiling == 8


def test_only_finished_starts_adapt_the_limit() -> None:
    async def main() -> None:
        limiter = StartLimiter(4)
        await limiter.acquire()
        limiter.release(None)  # a failed start says nothing about contention
        assert limiter._shortest is None and limiter.in_flight == 0
        await limiter.acquire()
        limiter.release(0.25)
        assert limiter._shortest == 0.25
        fixed = StartLimiter(4, adaptive=False)
        await fixed.acquire()
        fixed.release(0.25)
        assert fixed._shortest is None

        with pytest.raises(OSError):
            async with StartLimiter(4).slot() as slot:
                raise OSError("start failed")
        assert slot.limiter._shortest is None and slot.limiter.in_flight == 0
        async with StartLimiter(4).slot() as slot:
            await asyncio.sleep(0.01)
        # the 10 ms the slot was held (generous upper bound: a loaded machine)
        assert slot.limiter._shortest is not None and 0.005 <= slot.limiter._shortest < 5.0

    asyncio.run(main())


def test_a_waiter_granted_then_cancelled_hands_its_slot_to_the_next() -> None:
    async def main() -> None:
        limiter = StartLimiter(1, adaptive=False)
        await limiter.acquire()
        first = asyncio.create_task(limiter.acquire())
        second = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0.01)  # both queued
        limiter.release(None)  # grants `first` ...
        first.cancel()  # ... which is cancelled before it runs again
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 5)  # the slot went on to `second`
        assert limiter.in_flight == 1
        limiter.release(None)
        assert limiter.in_flight == 0

    asyncio.run(main())


def test_cancelled_waiters_leave_the_queue_at_once() -> None:
    """A cancelled run's queued starts do not stay queued until the next release (which may
    never come): the queue holds only live waiters."""

    async def main() -> None:
        limiter = StartLimiter(1, adaptive=False)
        await limiter.acquire()
        waiting = [asyncio.create_task(limiter.acquire()) for _ in range(100)]
        await asyncio.sleep(0.01)
        assert len(limiter._waiters) == 100
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert len(limiter._waiters) == 0 and limiter.in_flight == 1

    asyncio.run(main())
