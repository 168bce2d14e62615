"""The rollout driver through its public entry, `run_rollouts`, with a fake task and runtime.

Every expectation here is a literal or a bound the test itself sets (a sleep it asked for, a
count of calls it made): nothing is computed by the driver under test. The fakes count what
the driver does to them, so a runtime that is not stopped on some path fails a test, whatever
the runtime's real implementation is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from metrale.rollout import (
    ROLLOUT_METRICS,
    Progress,
    RolloutContext,
    RolloutPlan,
    RolloutRecord,
    StageTiming,
    run_rollout,
    run_rollouts,
    summarize_records,
)
from metrale.stats import Spread
from tests.conftest import cancel_when


@dataclass
class Ledger:
    """What the fakes saw, shared by every rollout of one test."""

    starts: int = 0
    stops: int = 0
    running: int = 0
    peak: int = 0
    events: list[str] = field(default_factory=list)


class FakeRuntime:
    """Counts start() and stop(); fails its first `fail_starts` starts (shared by the ledger)."""

    def __init__(self, ledger: Ledger, fail_starts: int = 0, fail_stop: bool = False) -> None:
        self.ledger, self.fail_starts, self.fail_stop = ledger, fail_starts, fail_stop

    async def start(self) -> None:
        self.ledger.starts += 1
        if self.ledger.starts <= self.fail_starts:
            raise RuntimeError(f"start {self.ledger.starts} failed")

    async def stop(self) -> None:
        self.ledger.stops += 1
        if self.fail_stop:
            raise RuntimeError("teardown failed")


class Boom(Exception):
    """A stage failure carrying the attributes the driver reads off endpoint errors."""

    def __init__(self, message: str, kind: str | None = None, retries: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.retries = retries


class Task:
    """Three stages that sleep, record what ran, and raise where told to."""

    def __init__(
        self,
        ledger: Ledger,
        index: int,
        *,
        fail: str | None = None,
        exc: BaseException | None = None,
        sleep_s: float = 0.0,
        reward: float | None = 1.0,
    ) -> None:
        self.ledger, self.index, self.fail = ledger, index, fail
        self.exc = exc or Boom(f"{fail} broke")
        self.sleep_s, self.reward = sleep_s, reward

    async def _stage(self, name: str, ctx: RolloutContext) -> None:
        self.ledger.events.append(f"{self.index}:{name}")
        await asyncio.sleep(self.sleep_s)
        if self.fail == name:
            raise self.exc

    async def setup(self, ctx: RolloutContext) -> None:
        await self._stage("setup", ctx)

    async def generate(self, ctx: RolloutContext) -> None:
        self.ledger.running += 1
        self.ledger.peak = max(self.ledger.peak, self.ledger.running)
        try:
            await self._stage("generation", ctx)
        finally:
            self.ledger.running -= 1

    async def score(self, ctx: RolloutContext) -> None:
        await self._stage("scoring", ctx)
        ctx.record.reward = self.reward


def plan(ledger: Ledger, count: int = 1, **kw: Any) -> RolloutPlan:
    task_kw = {k: kw.pop(k) for k in ("fail", "exc", "sleep_s", "reward") if k in kw}
    runtime_kw = {k: kw.pop(k) for k in ("fail_starts", "fail_stop") if k in kw}
    with_runtime = kw.pop("with_runtime", True)
    return RolloutPlan(
        benchmark="fake",
        count=count,
        make_task=lambda i: Task(ledger, i, **task_kw),
        make_runtime=(lambda _index: FakeRuntime(ledger, **runtime_kw)) if with_runtime else None,
        runtime_name="fake-rt" if with_runtime else None,
        **kw,
    )


def run(p: RolloutPlan, progress: Progress | None = None) -> list[RolloutRecord]:
    return asyncio.run(run_rollouts(p, progress))


# --------------------------------------------------------------------------- stop on every path


@pytest.mark.parametrize("fail", [None, "setup", "generation", "scoring"])
def test_every_started_runtime_is_stopped_once_whatever_stage_fails(fail: str | None) -> None:
    ledger = Ledger()
    records = run(plan(ledger, count=3, fail=fail))
    assert ledger.starts == 3 and ledger.stops == 3
    assert [r.error.stage if r.error else None for r in records] == [fail] * 3


def test_a_non_exception_failure_still_stops_the_runtime() -> None:
    ledger = Ledger()
    with pytest.raises(KeyboardInterrupt):
        run(plan(ledger, count=1, fail="generation", exc=KeyboardInterrupt()))
    assert ledger.starts == 1 and ledger.stops == 1


def test_a_cancelled_run_stops_every_runtime_it_started() -> None:
    ledger = Ledger()

    def all_in_setup() -> bool:
        return ledger.starts == 4 and len(ledger.events) == 4

    asyncio.run(cancel_when(run_rollouts(plan(ledger, count=4, sleep_s=30)), all_in_setup, 200))
    assert ledger.starts == 4 and ledger.stops == 4


def test_a_failed_start_is_stopped_and_retried_up_to_the_limit() -> None:
    ledger = Ledger()
    [record] = run(plan(ledger, fail_starts=2, runtime_retries=2))
    assert record.error is None and record.runtime_retries == 2
    assert ledger.starts == 3 and ledger.stops == 3  # two failed starts and the good one
    assert ledger.events == ["0:setup", "0:generation", "0:scoring"]


def test_a_start_failing_past_its_retries_is_a_setup_error_and_no_task_stage_runs() -> None:
    ledger = Ledger()
    [record] = run(plan(ledger, fail_starts=5, runtime_retries=1))
    assert record.error is not None
    assert (record.error.type, record.error.stage) == ("RuntimeError", "setup")
    assert record.error.message == "start 2 failed"
    assert record.runtime_retries == 1
    assert ledger.starts == 2 and ledger.stops == 2
    assert ledger.events == []
    assert set(record.stages) == {"setup"}


def test_a_failing_stop_is_the_rollouts_error_unless_it_already_has_one() -> None:
    [clean] = run(plan(Ledger(), fail_stop=True))
    assert clean.error is not None
    assert (clean.error.type, clean.error.message) == ("runtime_stop", "teardown failed")
    [failed] = run(plan(Ledger(), fail_stop=True, fail="scoring"))
    assert failed.error is not None and failed.error.type == "Boom"
    assert failed.error.stage == "scoring"


def test_no_runtime_means_no_start_and_no_stop() -> None:
    ledger = Ledger()
    [record] = run(plan(ledger, with_runtime=False))
    assert record.runtime is None and record.error is None
    assert ledger.starts == 0 and ledger.stops == 0


# --------------------------------------------------------------------------- records and clocks


def test_stage_clocks_cover_each_stage_in_order() -> None:
    before_wall = time.time()
    before = time.perf_counter()
    [record] = run(plan(Ledger(), sleep_s=0.05))
    elapsed = time.perf_counter() - before
    after_wall = time.time()
    assert list(record.stages) == ["setup", "generation", "scoring"]
    setup, gen, score = (record.stages[s] for s in ("setup", "generation", "scoring"))
    for t in (setup, gen, score):
        assert t.duration_s >= 0.05  # the task slept 50 ms in each stage
        assert t.duration_s == pytest.approx(t.end_s - t.start_s, abs=1e-9)
        assert 0 <= t.start_s < t.end_s <= elapsed
        assert before_wall <= t.started_at <= after_wall
    assert setup.end_s <= gen.start_s and gen.end_s <= score.start_s
    assert gen.started_at >= setup.started_at + 0.05
    assert record.total_s is not None
    assert record.total_s == pytest.approx(score.end_s - setup.start_s, abs=1e-9)
    assert record.total_s >= 0.15
    assert before_wall <= record.started_at <= setup.started_at


def test_a_failed_stage_is_clocked_and_the_later_ones_do_not_run() -> None:
    ledger = Ledger()
    [record] = run(plan(ledger, fail="generation", sleep_s=0.02))
    assert list(record.stages) == ["setup", "generation"]
    assert record.stages["generation"].duration_s >= 0.02
    assert record.total_s is not None and record.total_s >= 0.04
    assert record.reward is None
    assert ledger.events == ["0:setup", "0:generation"]


def test_records_name_the_run_benchmark_index_and_runtime() -> None:
    seen: list[RolloutRecord] = []
    records = run(plan(Ledger(), count=3, run_id="r7", on_record=seen.append))
    assert [r.id for r in records] == ["r7-0", "r7-1", "r7-2"]
    assert [r.index for r in records] == [0, 1, 2]
    assert {r.benchmark for r in records} == {"fake"}
    assert {r.runtime for r in records} == {"fake-rt"}
    assert sorted(r.id for r in seen) == ["r7-0", "r7-1", "r7-2"]
    assert all(r.error is None and r.reward == 1.0 for r in records)


def test_records_come_back_in_index_order_and_on_record_sees_them_as_they_end() -> None:
    class Staggered(Task):
        async def generate(self, ctx: RolloutContext) -> None:
            await asyncio.sleep(0.05 * (3 - self.index))  # index 2 ends first

    ledger = Ledger()
    seen: list[int] = []
    p = RolloutPlan(
        benchmark="fake", count=3, make_task=lambda i: Staggered(ledger, i),
        on_record=lambda r: seen.append(r.index),
    )  # fmt: skip
    records = run(p)
    assert [r.index for r in records] == [0, 1, 2]
    assert seen == [2, 1, 0]


def test_errors_keep_type_kind_message_stage_and_retries() -> None:
    [kinded] = run(plan(Ledger(), fail="generation", exc=Boom("HTTP 500", "http_500", 2)))
    assert kinded.error is not None
    assert kinded.error.model_dump() == {
        "type": "http_500", "message": "HTTP 500", "stage": "generation"
    }  # fmt: skip
    assert kinded.retries == 2
    [plain] = run(plan(Ledger(), fail="scoring", exc=ValueError("")))
    assert plain.error is not None
    assert plain.error.model_dump() == {"type": "ValueError", "message": "ValueError",
                                        "stage": "scoring"}  # fmt: skip
    assert plain.retries == 0
    [long] = run(plan(Ledger(), fail="setup", exc=ValueError("x" * 600)))
    assert long.error is not None and long.error.message == "x" * 500


def test_progress_counts_done_errors_and_mean_reward() -> None:
    ledger = Ledger()

    def make(i: int) -> Task:
        if i == 0:
            return Task(ledger, i, fail="generation")
        return Task(ledger, i, reward=[0.0, 1.0, 0.5, None][i - 1])

    progress = Progress()
    records = run(RolloutPlan(benchmark="fake", count=5, make_task=make), progress)
    assert (progress.done, progress.errors, progress.rewarded) == (5, 1, 3)
    assert progress.reward_sum == 1.5 and progress.mean_reward == 0.5
    assert len(progress.records) == 5 and len(records) == 5
    assert Progress().mean_reward is None


@pytest.mark.parametrize(("cap", "peak"), [(1, 1), (2, 2), (None, 6)])
def test_max_concurrent_bounds_how_many_generate_at_once(cap: int | None, peak: int) -> None:
    ledger = Ledger()
    run(plan(ledger, count=6, sleep_s=0.05, max_concurrent=cap, with_runtime=False))
    assert ledger.peak == peak


# --------------------------------------------------------------------------- summaries


def _timing(duration: float) -> StageTiming:
    return StageTiming(started_at=0.0, start_s=1.0, end_s=1.0 + duration, duration_s=duration)


def _record(index: int, **durations: float) -> RolloutRecord:
    return RolloutRecord(
        id=f"r-{index}", benchmark="fake", index=index, started_at=0.0,
        stages={k: _timing(v) for k, v in durations.items() if k != "total"},
        total_s=durations.get("total"),
    )  # fmt: skip


def test_stage_durations_are_sorted_per_stage_and_include_failed_stages() -> None:
    records = [
        _record(0, setup=0.3, generation=2.0, scoring=0.5, total=2.8),
        _record(1, setup=0.1, generation=1.0, total=1.1),  # failed in generation
        _record(2, setup=0.2),  # no total: it never finished a stage clock
    ]
    summary = summarize_records(records, ROLLOUT_METRICS)
    assert {k: list(v) for k, v in summary.durations.items()} == {
        "setup": [0.1, 0.2, 0.3],
        "generation": [1.0, 2.0],
        "scoring": [0.5],
        "total": [1.1, 2.8],
        "setup_wait": [],  # no sandbox: nothing queued, nothing stopped, nothing pooled
        "stop": [],
        "pool_start": [],
    }
    setup, scoring = Spread.of(summary.stage("setup")), Spread.of(summary.stage("scoring"))
    assert setup.n == 3 and setup.p50 == 0.2
    assert scoring.min == scoring.max == 0.5
    assert list(summarize_records([], ROLLOUT_METRICS).stage("total")) == []


def test_without_runtime_retries_one_failed_start_fails_the_rollout() -> None:
    ledger = Ledger()
    [record] = run(plan(ledger, fail_starts=1))
    assert record.error is not None and record.error.stage == "setup"
    assert (record.runtime_retries, ledger.starts, ledger.stops) == (0, 1, 1)
    [clean] = run(plan(Ledger()))
    assert (clean.runtime_retries, clean.retries) == (0, 0)


def test_a_long_teardown_message_is_cut_at_500_characters() -> None:
    class LongStop(FakeRuntime):
        async def stop(self) -> None:
            raise RuntimeError("y" * 600)

    p = RolloutPlan(benchmark="fake", count=1, make_task=lambda i: Task(Ledger(), i),
                    make_runtime=lambda _index: LongStop(Ledger()))  # fmt: skip
    [record] = run(p)
    assert record.error is not None and record.error.message == "y" * 500


class Restarting(Task):
    """Scores in a fresh runtime: `ctx.restart_runtime()` before scoring."""

    async def score(self, ctx: RolloutContext) -> None:
        first = ctx.runtime
        fresh = await ctx.restart_runtime()
        assert fresh is ctx.runtime and fresh is not first
        self.ledger.events.append(f"{self.index}:restarted")
        await super().score(ctx)


def test_a_restarted_runtime_replaces_the_first_and_both_are_stopped() -> None:
    ledger = Ledger()
    p = plan(ledger, count=2)
    p.make_task = lambda i: Restarting(ledger, i)
    records = run(p)
    assert [r.error for r in records] == [None, None]
    assert ledger.starts == 4 and ledger.stops == 4  # two runtimes a rollout, each stopped
    assert ledger.events.count("0:restarted") == 1 and ledger.events.count("1:restarted") == 1


def test_an_in_process_rollout_has_no_runtime_to_restart() -> None:
    ledger = Ledger()
    p = plan(ledger, with_runtime=False)
    p.make_task = lambda i: Restarting(ledger, i)
    [record] = run(p)
    assert record.error is not None and record.error.stage == "scoring"
    assert (record.error.type, record.error.message) == (
        "RuntimeError", "this rollout has no runtime to restart"
    )  # fmt: skip


def test_a_context_prints_without_its_restart_hook() -> None:
    record = RolloutRecord(id="r-0", benchmark="fake", index=0, started_at=0.0)
    ctx = RolloutContext(index=0, record=record, _restart=lambda c: None)  # type: ignore[arg-type,return-value]
    assert "_restart" not in repr(ctx) and "index=0" in repr(ctx)


def test_each_stage_metric_reads_its_own_duration_off_a_record() -> None:
    timing = StageTiming(started_at=0.0, start_s=0.0, end_s=0.5, duration_s=0.5)
    record = RolloutRecord(
        id="r-0", benchmark="fake", index=0, started_at=0.0, total_s=2.0, setup_wait_s=0.25,
        stop_s=0.125, stages={"generation": timing},
    )  # fmt: skip
    by_name = {m.name: m for m in ROLLOUT_METRICS}
    read = {n: by_name[n].value(record) for n in  # type: ignore[misc]
            ("setup", "generation", "scoring", "total", "setup_wait", "stop")}  # fmt: skip
    assert read == {"setup": None, "generation": 0.5, "scoring": None, "total": 2.0,
                    "setup_wait": 0.25, "stop": 0.125}  # fmt: skip


def test_only_per_rollout_values_are_sampled_not_stages_or_whole_run_values() -> None:
    from metrale.rollout.summary import sampled

    assert [m.name for m in sampled(ROLLOUT_METRICS)] == [
        "reward_mean", "error_rate", "errors", "retries"
    ]  # fmt: skip


def test_a_sample_of_few_distinct_values_is_kept_as_values_and_counts() -> None:
    from metrale.rollout.summary import compact

    assert compact([2.0, 1.0, 2.0, 2.0]) == {"values": [1.0, 2.0], "counts": [1, 3]}
    assert compact([]) == {"values": [], "counts": []}
    assert compact([(1.0, 2.0), (3.0, 4.0)]) == [[1.0, 2.0], [3.0, 4.0]]
    sixty_four = [float(i) for i in range(64)] * 2
    assert compact(sixty_four) == {"values": [float(i) for i in range(64)], "counts": [2] * 64}
    many = [float(i) for i in range(65)]
    assert compact(many) is many  # past 64 distinct values: the sample as it is


def test_a_count_reads_as_an_integer_and_a_mean_stays_a_float() -> None:
    recs = [RolloutRecord(id=f"r-{i}", benchmark="fake", index=i, started_at=0.0, reward=1.0)
            for i in range(3)]  # fmt: skip
    metrics = summarize_records(recs, ROLLOUT_METRICS).metrics
    assert repr(metrics["reward_mean"]) == "1.0" and repr(metrics["error_rate"]) == "0.0"
    assert repr(metrics["errors"]) == "0" and repr(metrics["retries"]) == "0"


# --------------------------------------------------------------------------- descriptors and bounds


class Limits:
    """A stand-in for `resource`'s RLIMIT_NOFILE: what it reports and what was set."""

    def __init__(self, soft: int, hard: int) -> None:
        self.soft, self.hard = soft, hard
        self.set: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        self.set.append(limits)
        self.soft = limits[0]


def fd_cap(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, open_fds: int | None,
           sandboxed: bool) -> tuple[int, list[tuple[int, int]]]:  # fmt: skip
    import resource

    from metrale.rollout import fds

    limits = Limits(soft, hard)
    monkeypatch.setattr(resource, "getrlimit", limits.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", limits.setrlimit)

    def listdir(path: str) -> list[str]:
        if open_fds is None:
            raise PermissionError(path)
        return [str(i) for i in range(open_fds)]

    monkeypatch.setattr(fds.os, "listdir", listdir)
    return fds.fd_concurrency_cap(sandboxed), limits.set


def test_the_fd_cap_is_what_the_limit_leaves_after_a_reserve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (soft - open - 64 reserved) // per rollout: 2 descriptors, 10 with a sandbox
    assert fd_cap(monkeypatch, 1024, 1024, 36, sandboxed=False) == (462, [])
    assert fd_cap(monkeypatch, 1024, 1024, 36, sandboxed=True) == (92, [])
    # /proc/self/fd unreadable: 32 open assumed
    assert fd_cap(monkeypatch, 1024, 1024, None, sandboxed=False) == (464, [])
    assert fd_cap(monkeypatch, 1025, 1025, None, sandboxed=False) == (464, [])  # 929 // 2
    # the soft limit is raised to the hard one, and not beyond 64 Ki
    assert fd_cap(monkeypatch, 1024, 4096, 36, sandboxed=True) == (399, [(4096, 4096)])
    inf = __import__("resource").RLIM_INFINITY
    assert fd_cap(monkeypatch, 1024, inf, 36, sandboxed=False) == (32718, [(65536, inf)])
    assert fd_cap(monkeypatch, inf, inf, 36, sandboxed=False) == (1 << 30, [])
    assert fd_cap(monkeypatch, 64, 64, 60, sandboxed=True) == (1, [])  # never below one


@pytest.mark.parametrize(
    ("asked", "warning"),
    [
        (3, None),  # exactly the cap: no warning
        (4, "max_concurrent 4 needs more file descriptors than the limit allows "
            "(RLIMIT_NOFILE 1000); running at most 3 rollouts at once "
            "(raise it with 'ulimit -n')"),
        (None, "max_concurrent unbounded needs more file descriptors than the limit allows "
               "(RLIMIT_NOFILE 1000); running at most 3 rollouts at once "
               "(raise it with 'ulimit -n')"),
    ],
)  # fmt: skip
def test_concurrency_past_the_fd_cap_is_cut_to_it_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, asked: int | None, warning: str | None
) -> None:
    import resource

    from metrale.rollout import pool

    monkeypatch.setattr(pool, "fd_concurrency_cap", lambda sandboxed: 3)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1000, 5000))
    ledger, warnings = Ledger(), []
    run(plan(ledger, count=8, sleep_s=0.02, max_concurrent=asked, on_warning=warnings.append))
    assert warnings == ([warning] if warning else [])
    assert ledger.peak == 3


def test_a_failing_on_record_stops_every_runtime_before_the_error_propagates() -> None:
    ledger = Ledger()

    class SlowStop(FakeRuntime):
        async def stop(self) -> None:
            await asyncio.sleep(0.05)
            await super().stop()

    def on_record(record: RolloutRecord) -> None:
        raise OSError("disk full")

    async def go() -> tuple[int, int]:
        p = plan(ledger, count=4, max_concurrent=4, on_record=on_record)
        p.make_task = lambda i: Task(ledger, i, sleep_s=0.01 if i == 0 else 5.0)
        p.make_runtime = lambda i: SlowStop(ledger)
        with pytest.raises(OSError, match="disk full"):
            await run_rollouts(p)
        return ledger.starts, ledger.stops  # at the moment the error reached the caller

    assert asyncio.run(go()) == (4, 4)


def test_a_ratio_metrics_sample_is_its_value_per_pairs() -> None:
    from metrale.plugin import Metric

    rate = Metric("tok_s", "tok/s", "higher", "tokens per second", stat="ratio",
                  value=lambda r: r.metrics["tokens"], per=lambda r: r.metrics["secs"])  # fmt: skip
    progress = Progress(metrics=[rate])
    for i, (tokens, secs) in enumerate(((10, 2), (30, 3))):
        progress.add(RolloutRecord(id=f"r-{i}", benchmark="fake", index=i, started_at=0.0,
                                   metrics={"tokens": tokens, "secs": secs}))  # fmt: skip
    assert progress.sample(rate) == [(10.0, 2.0), (30.0, 3.0)]
    assert rate.compute(progress.sample(rate)) == 8.0  # (10 + 30) / (2 + 3)


class TornDown(Task):
    """A task whose teardown fails; it records that it ran, after the runtime's stop."""

    async def teardown(self, ctx: RolloutContext) -> None:
        self.ledger.events.append(f"{self.index}:teardown after {self.ledger.stops} stop")
        raise ValueError("cleanup failed")


def test_a_failing_teardown_is_the_rollouts_error_unless_it_already_has_one() -> None:
    ledger = Ledger()
    p = plan(ledger)
    p.make_task = lambda i: TornDown(ledger, i)
    [clean] = run(p)
    assert clean.error is not None
    assert (clean.error.type, clean.error.message) == ("teardown", "cleanup failed")
    assert ledger.events[-1] == "0:teardown after 1 stop"
    p.make_task = lambda i: TornDown(ledger, i, fail="generation")
    [failed] = run(p)
    assert failed.error is not None
    assert (failed.error.type, failed.error.stage) == ("Boom", "generation")


def test_turns_add_up_over_the_rollouts_that_count_them() -> None:
    progress = Progress()
    assert progress.turns is None
    for i, turns in enumerate((2, None, 3)):
        progress.add(RolloutRecord(id=f"r-{i}", benchmark="fake", index=i, started_at=0.0,
                                   turns=turns))  # fmt: skip
    assert progress.turns == 5


def test_the_live_p50_is_over_every_value_up_to_4096_then_over_a_stride() -> None:
    progress = Progress()
    assert progress.running_p50("generation") is None

    def add(stage: str, values: Iterable[float]) -> None:
        for x in values:
            progress.durations[stage].add(x)

    add("generation", [4.0, 1.0, 3.0, 2.0])
    assert progress.running_p50("generation") == 2.5
    add("total", (float(i) for i in range(8190)))
    assert progress.running_p50("total") == 4094.5  # 8190 // 4096 = 1: every value
    add("total", [8190.0, 8191.0])
    # 8192 values: every 2nd (0, 2, ..., 8190), whose p50 is 4095 (the whole sample's: 4095.5)
    assert progress.running_p50("total") == 4095.0
    assert progress.running_p50("total", limit=8192) == 4095.5


def test_finish_completes_its_work_through_a_cancellation_then_raises_it() -> None:
    from metrale.rollout import finish

    ended: list[str] = []

    async def stop() -> int:
        await asyncio.sleep(0.1)
        ended.append("stopped")
        return 7

    async def main() -> None:
        assert await finish(stop()) == 7
        waiter = asyncio.create_task(finish(stop()))
        await asyncio.sleep(0.02)
        waiter.cancel()
        await asyncio.sleep(0.02)
        waiter.cancel()  # again: asyncio.run does this to what is left at exit
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert ended == ["stopped", "stopped"]  # the second stop ran to its end

    asyncio.run(main())


def test_finish_raises_a_cancellation_that_lands_as_its_work_ends() -> None:
    """The cancel reaches `finish` in the loop iteration in which its work completes (the
    work's task runs, then this test's, then `finish` wakes): the result is there, and the
    cancellation must still be raised, or a Ctrl-C at that moment would be lost and the
    worker would go on to its next rollout."""
    from metrale.rollout import finish

    async def work() -> int:
        return 7

    async def main() -> None:
        outer = asyncio.create_task(finish(work()))
        await asyncio.sleep(0)  # `finish` starts the work's task and waits on it
        await asyncio.sleep(0)  # the work's task has run and completed
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer

    asyncio.run(main())


def test_the_fd_cap_counts_sandboxes_and_only_the_rollouts_left_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from metrale.rollout import pool

    asked: list[bool] = []

    def cap(sandboxed: bool) -> int:
        asked.append(sandboxed)
        return 3

    monkeypatch.setattr(pool, "fd_concurrency_cap", cap)
    warnings: list[str] = []
    # A resumed run: 3 of 5 rollouts left, unbounded, a cap of 3: nothing to cut.
    records = run(plan(Ledger(), count=5, skip={0, 3}, on_warning=warnings.append))
    assert [r.index for r in records] == [1, 2, 4] and warnings == []
    run(plan(Ledger(), with_runtime=False))
    assert asked == [True, False]


class TimedStop(FakeRuntime):
    """A stop() that takes 50 ms."""

    async def stop(self) -> None:
        await asyncio.sleep(0.05)
        await super().stop()


def test_stop_s_is_the_final_stop_and_a_restarts_stop_is_inside_its_stage() -> None:
    ledger = Ledger()
    p = plan(ledger)
    p.make_runtime = lambda i: TimedStop(ledger)
    [once] = run(p)
    assert once.stop_s is not None and 0.05 <= once.stop_s < 1.0  # lower bound: the sleep
    p.make_task = lambda i: Restarting(ledger, i)
    [twice] = run(p)  # the first runtime stopped at the restart, in scoring
    assert twice.stop_s is not None and 0.05 <= twice.stop_s < 1.0
    assert twice.stages["scoring"].duration_s >= 0.05


def test_a_long_teardown_error_is_cut_at_500_characters() -> None:
    class LongTeardown(Task):
        async def teardown(self, ctx: RolloutContext) -> None:
            raise ValueError("z" * 600)

    ledger = Ledger()
    p = plan(ledger)
    p.make_task = lambda i: LongTeardown(ledger, i)
    [record] = run(p)
    assert record.error is not None and record.error.message == "z" * 500


def test_progress_adds_up_retries_and_runtime_retries_over_the_records() -> None:
    """Both retry counts come from the records, one rollout at a time: a failed call's
    retries (set once, on the record) and the sandbox starts retried."""
    ledger = Ledger()
    progress = Progress()
    run(plan(ledger, count=2, fail="generation", exc=Boom("HTTP 500", "http_500", 3),
             fail_starts=1, runtime_retries=1), progress)  # fmt: skip
    assert [r.retries for r in progress.records] == [3, 3]
    assert sum(r.runtime_retries for r in progress.records) == 1  # the first start failed
    assert (progress.retries, progress.runtime_retries) == (6, 1)


def test_a_task_that_cannot_be_made_is_the_rollouts_setup_error() -> None:
    """`make_task` raising fails that rollout (no runtime was started, none is stopped); the
    other rollouts run."""
    ledger = Ledger()

    def make(i: int) -> Task:
        if i == 1:
            raise ValueError("no such task file")
        return Task(ledger, i)

    p = plan(ledger, count=3)
    p.make_task = make
    records = run(p)
    assert [r.error.type if r.error else None for r in records] == [None, "ValueError", None]
    failed = records[1].error
    assert failed is not None and (failed.stage, failed.message) == ("setup", "no such task file")
    assert (ledger.starts, ledger.stops) == (2, 2)


class SlowStopRuntime(FakeRuntime):
    """A runtime whose stop() takes a while and says when it began."""

    async def stop(self) -> None:
        self.ledger.events.append("stopping")
        await asyncio.sleep(0.3)
        await super().stop()


def test_a_cancellation_during_a_stop_ends_the_run_after_that_stop() -> None:
    """The stop under way runs to its end, then the cancellation goes on: the worker takes
    no next rollout (a cancel swallowed there would let the run carry on as if nothing
    happened)."""
    ledger = Ledger()
    p = plan(ledger, count=5, max_concurrent=1)
    p.make_runtime = lambda _index: SlowStopRuntime(ledger)
    asyncio.run(cancel_when(run_rollouts(p), lambda: "stopping" in ledger.events))
    assert (ledger.starts, ledger.stops) == (1, 1)


def test_the_live_p50_of_a_stage_never_seen_is_none() -> None:
    assert Progress().running_p50("no_such_stage") is None
    assert Progress().running_p50("generation") is None


class TearingTask(Task):
    """A task whose teardown takes a while, says when it began and what error it saw."""

    async def teardown(self, ctx: RolloutContext) -> None:
        self.ledger.events.append("tearing")
        error = ctx.record.error
        self.ledger.events.append(f"saw {error.type}/{error.stage}" if error else "saw none")
        await asyncio.sleep(0.3)


def test_a_cancellation_during_a_teardown_ends_the_run_after_that_teardown() -> None:
    ledger = Ledger()
    p = plan(ledger, count=4, max_concurrent=1)
    p.make_task = lambda i: TearingTask(ledger, i)
    asyncio.run(cancel_when(run_rollouts(p), lambda: "tearing" in ledger.events))
    assert ledger.events.count("tearing") == 1 and (ledger.starts, ledger.stops) == (1, 1)


def test_a_cancelled_rollouts_teardown_sees_it_cancelled_in_its_stage() -> None:
    ledger = Ledger()
    p = plan(ledger, count=2, max_concurrent=1)
    p.make_task = lambda i: TearingTask(ledger, i, sleep_s=30)
    # each stage sleeps 30 s: cancelled in setup
    asyncio.run(cancel_when(run_rollouts(p), lambda: "0:setup" in ledger.events))
    assert "saw cancelled/setup" in ledger.events and ledger.stops == 1


def test_before_runtime_runs_first_without_a_sandbox_then_setup_has_one() -> None:
    ledger = Ledger()

    class Preparing(Task):
        async def before_runtime(self, ctx: RolloutContext) -> None:
            ledger.events.append(
                f"before: runtime {ctx.runtime is not None}, starts {ledger.starts}"
            )

        async def setup(self, ctx: RolloutContext) -> None:
            ledger.events.append(f"setup: runtime {ctx.runtime is not None}")

    p = plan(ledger, count=1)
    p.make_task = lambda i: Preparing(ledger, i)
    [record] = run(p)
    assert record.error is None
    assert ledger.events[:2] == ["before: runtime False, starts 0", "setup: runtime True"]


class _RecordsThenRaises(Task):
    """As gsm8k: the failed call's retries are copied onto the record, then its error (which
    carries the same retries) is re-raised."""

    async def generate(self, ctx: RolloutContext) -> None:
        ctx.record.retries = 3
        raise Boom("HTTP 503", "http_503", retries=3)


def test_retries_carried_by_both_the_record_and_the_error_count_once() -> None:
    ledger = Ledger()
    progress = Progress()
    p = plan(ledger, count=2)
    p.make_task = lambda i: _RecordsThenRaises(ledger, i)
    run(p, progress)
    assert [r.retries for r in progress.records] == [3, 3]
    assert progress.retries == 6


def test_a_start_is_retried_exactly_runtime_retries_times_however_many() -> None:
    """Each failed start counts once toward the limit: with 2 retries, the third failure ends
    the rollout (a counter that stopped counting would retry until a start succeeded)."""
    ledger = Ledger()
    [record] = run(plan(ledger, fail_starts=5, runtime_retries=2))
    assert record.error is not None and record.error.message == "start 3 failed"
    assert record.runtime_retries == 2
    assert ledger.starts == 3 and ledger.stops == 3


def test_a_resumed_unbounded_batch_runs_what_is_left_at_once() -> None:
    """Rollouts already recorded are skipped, and the rest still run together when no bound
    is given: the number left is counted, not collapsed to one."""
    ledger = Ledger()
    records = run(plan(ledger, count=6, skip={1, 4}, sleep_s=0.05, with_runtime=False))
    assert [r.index for r in records] == [0, 2, 3, 5]
    assert ledger.peak == 4


def test_retries_a_runtime_made_within_its_start_count_as_runtime_retries() -> None:
    """A remote runtime backs off and retries refused creations inside one start
    (`start_retries`): each counts on the rollout, on top of `--retries-runtime`'s restarts."""

    class Refused(FakeRuntime):
        async def start(self) -> None:
            self.start_retries = 3  # also counted when the start then fails
            await super().start()

    ledger = Ledger()
    p = plan(ledger, fail_starts=1, runtime_retries=1)
    p.make_runtime = lambda _index: Refused(ledger, fail_starts=1)
    [record] = run(p)
    assert record.error is None and record.runtime_retries == 3 + 1 + 3


# --------------------------------------------------------------------------- one rollout alone


class SeenClient:
    """A chat client the rollout's context must hand its stages (never called here)."""

    async def chat(self, messages: Any, **kw: Any) -> Any:
        raise AssertionError("not called")


def test_run_rollout_hands_its_own_client_and_stops_its_runtime_when_cancelled() -> None:
    ledger = Ledger()
    seen: list[object] = []
    own = SeenClient()

    class Sees(Task):
        async def setup(self, ctx: RolloutContext) -> None:
            seen.append(ctx.client)
            await super().setup(ctx)

    p = plan(ledger, sleep_s=30)
    p.make_task = lambda i: Sees(ledger, i, sleep_s=30)

    def in_setup() -> bool:
        return ledger.starts == 1 and len(ledger.events) == 1

    one = run_rollout(p, 7, time.perf_counter(), client=own)  # type: ignore[arg-type]
    asyncio.run(cancel_when(one, in_setup, 200))
    assert seen == [own] and ledger.starts == 1 and ledger.stops == 1
    assert p.limiter is not None  # the plan's one limiter, made for the first rollout


def test_run_rollout_returns_the_record_of_the_index_it_was_given() -> None:
    ledger = Ledger()
    record = asyncio.run(run_rollout(plan(ledger), 5, time.perf_counter()))
    assert record.index == 5 and record.reward == 1.0 and record.error is None
    assert set(record.stages) == {"setup", "generation", "scoring"}
    assert ledger.starts == 1 and ledger.stops == 1
