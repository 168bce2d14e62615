"""Run N rollouts under a concurrency bound, clock their stages, and record each one.

A rollout is three stages timed here and nowhere else: **setup** (provisioning the runtime, if
any, then the task's own setup), **generation**, **scoring**. **total** = end of the last stage
that ran − start of setup. Durations come from `time.perf_counter()`; each stage also keeps its
wall-clock start. A stage that raises ends the rollout: the error is recorded on it (type,
message, stage) and the run goes on. The record is handed to `on_record` as the rollout ends,
whatever happened, so the run directory has it before the next one finishes.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrale.plugin.metrics import Metric
from metrale.plugin.results import SUMMARY_STAGES
from metrale.rollout.fds import fd_concurrency_cap
from metrale.rollout.limiter import StartLimiter
from metrale.rollout.records import (
    ErrorInfo,
    RolloutContext,
    RolloutRecord,
    RolloutTask,
    Stage,
    StageTiming,
)
from metrale.rollout.reservoir import Reservoir
from metrale.rollout.teardown import finish
from metrale.rollout.warm import Warm, WarmPool
from metrale.runtime.base import Runtime
from metrale.stats import percentile

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from metrale.endpoint.client import ChatModel


#: Durations a sandboxed rollout has beside its stages: `setup_wait`, the part of setup spent
#: queued for a start slot (the limiter's; setup includes it), and `stop`, its sandbox's
#: teardown (after scoring, not in total), and `pool_start`, the start the warm pool did ahead
#: of it (`warm`; not in setup).
RUNTIME_DURATIONS: tuple[str, ...] = ("setup_wait", "stop", "pool_start")


@dataclass
class RolloutPlan:
    """How to run a batch: how many, how many at once, where, and who to tell.

    `skip` holds indices that already have a record (a resumed run): they are not run again.
    `on_record` may raise (the run directory's disk is full): the batch then stops, every
    rollout in flight is cancelled and its runtime stopped, and the error propagates.
    """

    benchmark: str
    count: int
    make_task: Callable[[int], RolloutTask]
    max_concurrent: int | None = None
    #: a new, not yet started runtime for rollout `index` (None: rollouts run in-process)
    make_runtime: Callable[[int], Runtime] | None = None
    runtime_name: str | None = None
    runtime_retries: int = 0
    on_record: Callable[[RolloutRecord], None] = lambda record: None
    run_id: str = "run"
    skip: Collection[int] = frozenset()
    #: called once with a line to show the user (a concurrency cap, for example)
    on_warning: Callable[[str], None] = lambda message: None
    #: handed to every rollout's context
    client: ChatModel | None = None
    run_dir: Path | None = None
    #: sandbox starts in flight at once: None adapts to the measured start latency (from
    #: twice the cores), 0 is no bound, N a fixed bound (`limiter`)
    start_limit: int | None = None
    #: made by `run_rollouts` from `start_limit` unless given (shared by every start of the run)
    limiter: StartLimiter | None = None
    #: sandboxes started ahead of the rollouts that will use them (`warm`); 0: none
    runtime_pool: int = 0


@dataclass
class Progress:
    """Live counters the runner reads while rollouts run, and what the summary needs.

    Memory stays O(concurrency): no record is kept, unless `keep_records` asks for the records
    themselves (a benchmark with few, large rollouts that reports on each); each stage's
    durations and each declared metric's values are a `Reservoir` (exact totals, at most
    `SAMPLE_CAP` values kept).
    """

    done: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0
    retries: int = 0
    runtime_retries: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: agent turns over the finished rollouts that count them (None: none does)
    turns: int | None = None
    token_sources: set[str] = field(default_factory=set)
    error_kinds: dict[str, int] = field(default_factory=dict)
    durations: dict[str, Reservoir] = field(
        default_factory=lambda: {s: Reservoir(s) for s in (*SUMMARY_STAGES, *RUNTIME_DURATIONS)}
    )
    keep_records: bool = True
    records: list[RolloutRecord] = field(default_factory=list)
    #: declared metrics whose per-rollout samples are collected as records arrive
    metrics: Sequence[Metric] = ()
    samples: dict[str, Reservoir] = field(default_factory=dict)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    def add(self, record: RolloutRecord) -> None:
        """Count one finished rollout (a new one, or one read back from a resumed run)."""
        if self.keep_records:
            self.records.append(record)
        self.done += 1
        if record.error is not None:
            self.errors += 1
            kind = record.error.type
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
        if record.reward is not None:
            self.reward_sum += record.reward
            self.rewarded += 1
        self.retries += record.retries
        if record.turns is not None:
            self.turns = (self.turns or 0) + record.turns
        self.runtime_retries += record.runtime_retries
        if record.tokens.prompt is not None:
            self.prompt_tokens = (self.prompt_tokens or 0) + record.tokens.prompt
        if record.tokens.completion is not None:
            self.completion_tokens = (self.completion_tokens or 0) + record.tokens.completion
        if record.tokens.source:
            self.token_sources.add(record.tokens.source)
        for name, timing in record.stages.items():
            self.durations[name].add(timing.duration_s)
        extra = {"total": record.total_s, "setup_wait": record.setup_wait_s,
                 "stop": record.stop_s, "pool_start": record.pool_start_s}  # fmt: skip
        for name, value in extra.items():
            if value is not None:
                self.durations[name].add(value)
        for metric in self.metrics:
            x = metric.sample_of(record)
            if x is None:
                continue
            values = self.samples.get(metric.name)
            if values is None:
                width = 2 if metric.stat == "ratio" else 1
                values = self.samples[metric.name] = Reservoir(metric.name, width=width)
            values.add(x)

    def sample(self, metric: Metric) -> Sequence[Any]:
        """The kept sample of `metric`: its floats (the array itself, not a copy), or
        (value, per) pairs for a ratio; every value up to `SAMPLE_CAP` rollouts."""
        found = self.samples.get(metric.name)
        return found.kept() if found is not None else []

    def running_p50(self, stage: str, limit: int = 4096) -> float | None:
        """The p50 so far of `stage`'s durations, for the live view: over every value up to
        `limit` of them, else over an even stride of `limit` (a live estimate that costs the
        same at a million rollouts as at four thousand; the summary uses every value)."""
        found = self.durations.get(stage)
        if not found:
            return None
        values = found.values
        step = max(1, len(values) // limit)
        return percentile(sorted(values[::step]), 50)


async def run_rollouts(plan: RolloutPlan, progress: Progress | None = None) -> list[RolloutRecord]:
    """Run rollouts `0..plan.count-1` not in `plan.skip`, at most `plan.max_concurrent` at once
    (None: unbounded, up to what the file-descriptor limit allows).

    A fixed pool of workers pulls indices from one iterator, so memory is O(concurrency), not
    O(count): a million rollouts never exist as a million tasks. On cancellation (Ctrl-C,
    SIGTERM) or a failing `on_record`, every worker is cancelled and *waited for*, so that
    every runtime that started is stopped before this returns or raises.
    """
    progress = progress if progress is not None else Progress()
    origin = time.perf_counter()
    todo = sum(1 for i in range(plan.count) if i not in plan.skip) if plan.skip else plan.count
    cap = fd_concurrency_cap(plan.make_runtime is not None)
    width = min(plan.max_concurrent or todo, todo)
    if width > cap:
        asked = plan.max_concurrent if plan.max_concurrent else "unbounded"
        plan.on_warning(
            f"max_concurrent {asked} needs more file descriptors than the limit allows "
            f"(RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}); "
            f"running at most {cap} rollouts at once (raise it with 'ulimit -n')"
        )
        width = cap
    indices = (i for i in range(plan.count) if i not in plan.skip)
    _ensure_limiter(plan)

    pool = None
    if plan.make_runtime is not None and plan.runtime_pool > 0:
        pool = WarmPool(plan.runtime_pool, indices, lambda i: _warm_start(plan, i))

    async def worker() -> None:
        if pool is None:
            for index in indices:  # one shared iterator: each index goes to exactly one worker
                await done_one(await _run_one(plan, index, origin))
            return
        while (item := pool.next()) is not None:
            await done_one(await _run_one(plan, item[0], origin, (pool, item[1])))

    async def done_one(record: RolloutRecord) -> None:
        progress.add(record)
        plan.on_record(record)

    workers = [asyncio.create_task(worker()) for _ in range(max(width, 0))]
    try:
        if workers:
            done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
    finally:
        for task in workers:
            task.cancel()
        await finish(asyncio.gather(*workers, return_exceptions=True))
        if pool is not None:
            await finish(pool.close())
    return sorted(progress.records, key=lambda r: r.index) if progress.keep_records else []


def _ensure_limiter(plan: RolloutPlan) -> None:
    """The run's one start limiter, made from `start_limit` unless the plan holds one."""
    if plan.make_runtime is not None and plan.limiter is None and plan.start_limit != 0:
        fixed = plan.start_limit is not None
        plan.limiter = StartLimiter(plan.start_limit, adaptive=not fixed)


async def run_rollout(
    plan: RolloutPlan, index: int, origin: float, client: ChatModel | None = None
) -> RolloutRecord:
    """Rollout `index` of `plan`, alone, for a caller that schedules rollouts itself (serve's
    live sessions: one after another in each lane, each with a chat `client` of its own in
    place of the plan's). The same stages, clocks, runtime start (the plan's one limiter,
    retries) and stop on every path, cancellation included, as in `run_rollouts`;
    `on_record` is the caller's to call. Stage times count from `origin` (perf_counter)."""
    _ensure_limiter(plan)
    return await _run_one(plan, index, origin, client=client)


async def _run_one(
    plan: RolloutPlan,
    index: int,
    origin: float,
    warm: tuple[WarmPool, asyncio.Task[Warm]] | None = None,
    client: ChatModel | None = None,
) -> RolloutRecord:
    record = RolloutRecord(
        id=f"{plan.run_id}-{index}",
        benchmark=plan.benchmark,
        index=index,
        runtime=plan.runtime_name,
        started_at=time.time(),
    )
    chat = client if client is not None else plan.client
    ctx = RolloutContext(index=index, record=record, client=chat, run_dir=plan.run_dir)
    if plan.make_runtime is not None:
        ctx._restart = lambda c: _restart_runtime(plan, c)
    stage = Stage.SETUP
    task: RolloutTask | None = None
    try:
        task = plan.make_task(index)
        async with _clock(record, Stage.SETUP, origin):
            before = getattr(task, "before_runtime", None)
            if before is not None:
                if warm is not None:  # the driver refuses a pool for such a benchmark
                    raise RuntimeError("a task with before_runtime cannot take a pooled sandbox")
                await before(ctx)
            if warm is not None:
                pooled = await warm[0].claim(warm[1])
                ctx.runtime = pooled.runtime
                record.pool_start_s = pooled.start_s
                record.runtime_retries += pooled.retries
            elif plan.make_runtime is not None:
                ctx.runtime = await _start_runtime(plan, record)
            await task.setup(ctx)
        stage = Stage.GENERATION
        async with _clock(record, Stage.GENERATION, origin):
            await task.generate(ctx)
        stage = Stage.SCORING
        async with _clock(record, Stage.SCORING, origin):
            await task.score(ctx)
    except asyncio.CancelledError:
        record.error = ErrorInfo(type="cancelled", message="run cancelled", stage=stage)
        raise
    except Exception as exc:
        logger.debug("rollout %d failed in %s", record.index, stage, exc_info=exc)
        record.error = ErrorInfo(
            type=getattr(exc, "kind", None) or type(exc).__name__,
            message=str(exc)[:500] or type(exc).__name__,
            stage=stage,
        )
        # The task owns `record.retries` (it knows which calls it made); the driver adds only
        # what a task that never recorded its failed call could not.
        if not record.retries:
            record.retries = int(getattr(exc, "retries", 0) or 0)
    finally:
        if ctx.runtime is not None:
            stopping = time.perf_counter()
            try:
                await finish(ctx.runtime.stop())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed teardown is the rollout's fault, not the run's
                if record.error is None:
                    record.error = ErrorInfo(type="runtime_stop", message=str(exc)[:500])
                else:  # the record keeps its first error: say this one here
                    logger.warning("rollout %d: runtime stop failed: %r", record.index, exc)
            finally:
                record.stop_s = (record.stop_s or 0.0) + time.perf_counter() - stopping
        after = getattr(task, "teardown", None)
        if after is not None:
            try:
                await finish(after(ctx))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if record.error is None:
                    record.error = ErrorInfo(type="teardown", message=str(exc)[:500])
                else:
                    logger.warning("rollout %d: teardown failed: %r", record.index, exc)
        timings = record.stages.values()
        if timings:
            record.total_s = max(t.end_s for t in timings) - min(t.start_s for t in timings)
    return record


async def _start_runtime(plan: RolloutPlan, record: RolloutRecord) -> Runtime:
    """Start a runtime, retrying up to `runtime_retries`; whatever happens to a start (it fails,
    or the run is cancelled while it is under way), that runtime's `stop()` runs to its end.
    A runtime that retried within its start (a remote service's 429s) says how many times in
    `start_retries`; those count as the rollout's runtime retries too."""
    assert plan.make_runtime is not None
    attempt = 0
    while True:
        runtime = plan.make_runtime(record.index)
        try:
            if plan.limiter is None:
                await runtime.start()
            else:
                async with plan.limiter.slot() as slot:
                    record.setup_wait_s = (record.setup_wait_s or 0.0) + slot.waited_s
                    await runtime.start()
            return runtime
        except BaseException as exc:
            await finish(runtime.stop())
            if not isinstance(exc, Exception) or attempt >= plan.runtime_retries:
                raise
            attempt += 1
            record.runtime_retries += 1
        finally:
            # a remote service's refusals its runtime backed off and retried within one start
            record.runtime_retries += getattr(runtime, "start_retries", 0)


async def _warm_start(plan: RolloutPlan, index: int) -> Warm:
    """The warm pool's start of rollout `index`'s sandbox: as a rollout's own (the start limiter,
    `runtime_retries`), its retries handed to the rollout that takes it."""
    scratch = RolloutRecord(id="", benchmark=plan.benchmark, index=index, started_at=0.0)
    runtime = await _start_runtime(plan, scratch)
    return Warm(runtime, start_s=0.0, retries=scratch.runtime_retries)


async def _restart_runtime(plan: RolloutPlan, ctx: RolloutContext) -> Runtime:
    """Stop the rollout's runtime and start a fresh one in its place (`ctx.restart_runtime`)."""
    old, ctx.runtime = ctx.runtime, None
    if old is not None:
        await finish(old.stop())
    ctx.runtime = await _start_runtime(plan, ctx.record)
    return ctx.runtime


class _clock:
    """Times one stage into `record.stages`, whether the stage returns or raises."""

    def __init__(self, record: RolloutRecord, stage: Stage, origin: float) -> None:
        self.record, self.stage, self.origin = record, stage, origin

    async def __aenter__(self) -> None:
        self.wall = time.time()
        self.start = time.perf_counter()

    async def __aexit__(self, *exc: object) -> None:
        end = time.perf_counter()
        # model_construct: three validated models per rollout cost more than the scoring stage.
        self.record.stages[self.stage] = StageTiming.model_construct(
            started_at=self.wall,
            start_s=self.start - self.origin,
            end_s=end - self.origin,
            duration_s=end - self.start,
        )
