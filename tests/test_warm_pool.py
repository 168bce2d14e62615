"""The warm pool (`--runtime-pool N`): sandboxes started ahead, one per rollout, never reused,
none left on any exit path, the pool's start reported apart from setup."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from metrale.rollout import Progress, RolloutContext, RolloutPlan, RolloutRecord, run_rollouts
from metrale.rollout.summary import STAGE_METRICS, build_summary
from metrale.rollout.warm import Warm, WarmPool
from tests.conftest import cancel_when


@dataclass
class Book:
    made: list[PooledRuntime] = field(default_factory=list)
    #: (event, runtime number) in the order they happened
    events: list[tuple[str, int]] = field(default_factory=list)


class PooledRuntime:
    """Starts in `start_s`; notes who used it; fails to start when told."""

    def __init__(self, book: Book, index: int, start_s: float, fail: bool = False) -> None:
        self.book, self.index, self.start_s, self.fail = book, index, start_s, fail
        self.number = len(book.made)
        book.made.append(self)
        self.started = self.stopped = 0
        self.used_by: list[int] = []

    async def start(self) -> None:
        self.book.events.append(("start", self.number))
        await asyncio.sleep(self.start_s)
        if self.fail:
            raise RuntimeError(f"start of sandbox {self.number} failed")
        self.started += 1

    async def stop(self) -> None:
        self.book.events.append(("stop", self.number))
        self.stopped += 1


class UsingTask:
    """Notes which rollout used its sandbox; each stage sleeps `sleep_s`."""

    def __init__(self, index: int, sleep_s: float) -> None:
        self.index, self.sleep_s = index, sleep_s

    async def setup(self, ctx: RolloutContext) -> None:
        runtime = ctx.runtime
        assert isinstance(runtime, PooledRuntime) and runtime.index == self.index
        runtime.used_by.append(self.index)
        await asyncio.sleep(self.sleep_s)

    async def generate(self, ctx: RolloutContext) -> None:
        await asyncio.sleep(self.sleep_s)

    async def score(self, ctx: RolloutContext) -> None:
        ctx.record.reward = 1.0


def pooled_plan(book: Book, count: int, pool: int, *, start_s: float = 0.0,
                sleep_s: float = 0.0, fail_index: int | None = None,
                **kw: object) -> RolloutPlan:  # fmt: skip
    return RolloutPlan(
        benchmark="fake",
        count=count,
        make_task=lambda i: UsingTask(i, sleep_s),
        make_runtime=lambda i: PooledRuntime(book, i, start_s, fail=i == fail_index),
        runtime_name="fake-rt",
        runtime_pool=pool,
        start_limit=0,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("count", "pool", "concurrent"), [(10, 3, 2), (5, 8, 1), (7, 1, None)])
def test_each_rollout_gets_its_own_fresh_sandbox_and_no_more_are_started(
    count: int, pool: int, concurrent: int | None
) -> None:
    book = Book()
    records = asyncio.run(run_rollouts(pooled_plan(book, count, pool, max_concurrent=concurrent)))
    assert [r.error for r in records] == [None] * count
    assert len(book.made) == count  # one per rollout: the pool never starts a spare
    assert sorted(rt.index for rt in book.made) == list(range(count))
    assert [rt.used_by for rt in sorted(book.made, key=lambda r: r.index)] == [
        [i] for i in range(count)
    ]
    assert [(rt.started, rt.stopped) for rt in book.made] == [(1, 1)] * count
    assert all(r.pool_start_s is not None for r in records)


def test_the_pools_start_is_reported_apart_and_setup_holds_only_the_wait() -> None:
    # one rollout at a time, a 0.3 s start and a 0.3 s stage: with a pool of 1, each next
    # sandbox starts while the rollout before it runs, so its setup waits for nothing
    book = Book()
    progress = Progress(keep_records=True)
    records = asyncio.run(
        run_rollouts(pooled_plan(book, 4, 1, start_s=0.3, sleep_s=0.1, max_concurrent=1), progress)
    )
    # never shorter than the start itself, and a duration, not a clock reading
    assert all(0.3 <= r.pool_start_s < 30 for r in records)
    later = [r.stages["setup"].duration_s for r in records[1:]]
    # each stage sleeps 0.1 s, so setup is >= 0.1; a start on the path would add its 0.3 s
    assert max(later) < 0.1 + 0.2, later
    summary = build_summary(progress, STAGE_METRICS, None)
    assert summary.metrics["pool_start"] >= 0.3
    assert len(summary.durations["pool_start"]) == 4


def test_a_failed_pooled_start_fails_only_its_rollout_and_is_stopped() -> None:
    book = Book()
    records = asyncio.run(run_rollouts(pooled_plan(book, 5, 2, fail_index=2, max_concurrent=2)))
    assert [r.error.stage if r.error else None for r in records] == [
        None, None, "setup", None, None,
    ]  # fmt: skip
    assert "start of sandbox" in records[2].error.message
    assert [rt.stopped for rt in book.made] == [1] * 5


def test_a_cancelled_run_stops_the_pools_sandboxes_started_or_starting() -> None:
    book = Book()

    # two rollouts in flight, three more sandboxes starting or ready in the pool
    run = run_rollouts(pooled_plan(book, 50, 3, start_s=0.05, sleep_s=30, max_concurrent=2))

    def five_starts_begun() -> bool:
        return len(book.made) == 5 and all(rt.started for rt in book.made[:2])

    asyncio.run(cancel_when(run, five_starts_begun, 300))
    assert len(book.made) == 5
    started = [rt for rt in book.made if rt.started]
    assert started and all(rt.stopped == 1 for rt in book.made)


def test_records_say_nothing_of_a_pool_when_there_is_none() -> None:
    book = Book()
    records: list[RolloutRecord] = asyncio.run(run_rollouts(pooled_plan(book, 3, 0)))
    assert [r.pool_start_s for r in records] == [None, None, None]


def test_a_benchmark_that_fills_its_sandboxes_before_the_start_refuses_a_pool() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "metrale", "run", "agentic_webserver", "--runtime", "bwrap",
         "--runtime-pool", "2", "--target", "http://127.0.0.1:9/v1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "metrale: error: --runtime-pool: agentic_webserver prepares each sandbox's files "
        "before its start, so no sandbox can be started ahead of its rollout; accepted: "
        "--runtime-pool 0 (the default)"
    ]


class PreparingTask(UsingTask):
    """A task that must write into its sandbox's directory before the sandbox starts."""

    async def before_runtime(self, ctx: RolloutContext) -> None:
        raise AssertionError("before_runtime ran although the sandbox was started already")


def test_the_driver_itself_refuses_a_pooled_sandbox_to_a_task_that_prepares_one() -> None:
    """Past the CLI's refusal, the driver fails each such rollout instead of running
    `before_runtime` on a sandbox already started; every pooled sandbox is still stopped."""
    book = Book()
    plan = pooled_plan(book, 3, 2)
    plan.make_task = lambda i: PreparingTask(i, 0.0)
    records = asyncio.run(run_rollouts(plan))
    assert [(r.error.type, r.error.stage) if r.error else None for r in records] == [
        ("RuntimeError", "setup")
    ] * 3
    assert records[0].error is not None
    assert records[0].error.message == "a task with before_runtime cannot take a pooled sandbox"
    assert [rt.used_by for rt in book.made] == [[], [], []]
    assert all(rt.stopped == rt.started for rt in book.made)


def test_a_pooled_start_retried_hands_its_retries_to_its_rollout() -> None:
    book = Book()
    failed: set[int] = set()

    def make(i: int) -> PooledRuntime:
        fail = i == 1 and i not in failed  # rollout 1's first start fails, its retry works
        failed.add(i)
        return PooledRuntime(book, i, 0.0, fail=fail)

    plan = pooled_plan(book, 3, 2, runtime_retries=1)
    plan.make_runtime = make
    records = asyncio.run(run_rollouts(plan))
    assert [r.error for r in records] == [None, None, None]
    assert [r.runtime_retries for r in records] == [0, 1, 0]


def test_a_pool_holds_at_least_one_sandbox() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        WarmPool(0, iter(range(3)), _never)


async def _never(index: int) -> Warm:
    raise AssertionError("no start expected")


def test_close_cancels_starts_under_way_stops_the_unclaimed_and_starts_no_more() -> None:
    book = Book()
    outcomes = {0: "fail", 1: "hang"}  # then 2 and 3 start at once

    async def start(index: int) -> Warm:
        runtime = PooledRuntime(book, index, 0.0)
        if outcomes.get(index) == "fail":
            raise RuntimeError("start failed")
        if outcomes.get(index) == "hang":
            await asyncio.sleep(30)
        await runtime.start()
        return Warm(runtime, start_s=0.0, retries=0)

    async def go() -> WarmPool:
        pool = WarmPool(4, iter(range(10)), start)
        pool.next()  # rollout 0's start (it fails); 1..4 are started ahead
        await asyncio.sleep(0.05)  # 0 failed, 1 hangs, 2..4 ready
        await asyncio.wait_for(pool.close(), 5)  # the hanging start is cancelled, not awaited
        assert pool.next() is None  # a closed pool hands out nothing and starts nothing
        await pool.close()  # closing again stops nothing twice
        return pool

    asyncio.run(go())
    ready = [rt for rt in book.made if rt.started]
    assert sorted(rt.index for rt in ready) == [2, 3, 4]
    assert [rt.stopped for rt in ready] == [1, 1, 1]  # past the failed one: every unclaimed
    assert len(book.made) == 5
