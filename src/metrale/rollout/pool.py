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
import contextlib
import os
import resource
import time
from array import array
from collections.abc import Awaitable, Callable, Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from metrale.plugin.metrics import Metric
from metrale.plugin.results import SUMMARY_STAGES
from metrale.rollout.limiter import StartLimiter
from metrale.rollout.records import (
    ErrorInfo,
    RolloutContext,
    RolloutRecord,
    RolloutTask,
    Stage,
    StageTiming,
)
from metrale.runtime.base import Runtime
from metrale.stats import percentile

if TYPE_CHECKING:
    from metrale.endpoint.client import ChatClient

T = TypeVar("T")

#: Durations a sandboxed rollout has beside its stages: `setup_wait`, the part of setup spent
#: queued for a start slot (the limiter's; setup includes it), and `stop`, its sandbox's
#: teardown (after scoring, not in total).
RUNTIME_DURATIONS: tuple[str, ...] = ("setup_wait", "stop")


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
    skip: Container[int] = frozenset()
    #: called once with a line to show the user (a concurrency cap, for example)
    on_warning: Callable[[str], None] = lambda message: None
    #: handed to every rollout's context
    client: ChatClient | None = None
    run_dir: Path | None = None
    #: sandbox starts in flight at once: None adapts to the measured start latency (from
    #: twice the cores), 0 is no bound, N a fixed bound (`limiter`)
    start_limit: int | None = None
    #: made by `run_rollouts` from `start_limit` unless given (shared by every start of the run)
    limiter: StartLimiter | None = None


@dataclass
class Progress:
    """Live counters the runner reads while rollouts run, and what the summary needs.

    Memory stays O(concurrency) in records: only per-stage durations (8 bytes each) and
    counters are kept, unless `keep_records` asks for the records themselves (a benchmark with
    few, large rollouts that reports on each).
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
    durations: dict[str, array[float]] = field(
        default_factory=lambda: {s: array("d") for s in (*SUMMARY_STAGES, *RUNTIME_DURATIONS)}
    )
    keep_records: bool = True
    records: list[RolloutRecord] = field(default_factory=list)
    #: declared metrics whose per-rollout samples are collected as records arrive (8 bytes a
    #: value, two for a ratio's pair)
    metrics: Sequence[Metric] = ()
    samples: dict[str, array[float]] = field(default_factory=dict)

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
            self.durations[name].append(timing.duration_s)
        if record.total_s is not None:
            self.durations["total"].append(record.total_s)
        if record.setup_wait_s is not None:
            self.durations["setup_wait"].append(record.setup_wait_s)
        if record.stop_s is not None:
            self.durations["stop"].append(record.stop_s)
        for metric in self.metrics:
            x = metric.sample_of(record)
            if x is None:
                continue
            values = self.samples.get(metric.name)
            if values is None:
                values = self.samples[metric.name] = array("d")
            if isinstance(x, tuple):
                values.extend(x)
            else:
                values.append(x)

    def sample(self, metric: Metric) -> Sequence[Any]:
        """The collected sample of `metric`: its floats (the array itself, not a copy), or
        (value, per) pairs for a ratio."""
        values = self.samples.get(metric.name, array("d"))
        if metric.stat == "ratio":
            return list(zip(values[0::2], values[1::2], strict=True))
        return values

    def running_p50(self, stage: str, limit: int = 4096) -> float | None:
        """The p50 so far of `stage`'s durations, for the live view: over every value up to
        `limit` of them, else over an even stride of `limit` (a live estimate that costs the
        same at a million rollouts as at four thousand; the summary uses every value)."""
        values = self.durations.get(stage)
        if not values:
            return None
        step = max(1, len(values) // limit)
        return percentile(sorted(values[::step]), 50)


#: File descriptors one rollout in flight may hold: its connection to the target, and with a
#: runtime the sandbox's pipes, pidfd and workdir (bwrap measured at 6).
FDS_PER_ROLLOUT = 2
FDS_PER_SANDBOXED_ROLLOUT = 10
#: Descriptors kept free for everything else: the run directory's files, the event loop, logs.
FD_RESERVE = 64
FD_RAISE_TO = 1 << 16


def fd_concurrency_cap(sandboxed: bool) -> int:
    """How many rollouts may be in flight before the process runs out of file descriptors.

    The soft RLIMIT_NOFILE is first raised to the hard limit (what a user may do without
    privilege); what remains after the descriptors already open and a reserve, divided by a
    rollout's share, is the cap.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        # Not beyond 64 Ki: sandboxes inherit the limit, and some programs walk every fd.
        # (RLIM_INFINITY is -1: min() with it would keep the soft limit where it is)
        want = max(soft, FD_RAISE_TO if hard == resource.RLIM_INFINITY else min(FD_RAISE_TO, hard))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 32
    per = FDS_PER_SANDBOXED_ROLLOUT if sandboxed else FDS_PER_ROLLOUT
    return max(1, (soft - open_now - FD_RESERVE) // per)


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
    if plan.make_runtime is not None and plan.limiter is None and plan.start_limit != 0:
        fixed = plan.start_limit is not None
        plan.limiter = StartLimiter(plan.start_limit, adaptive=not fixed)

    async def worker() -> None:
        for index in indices:  # one shared iterator: each index goes to exactly one worker
            record = await _run_one(plan, index, origin)
            progress.add(record)
            plan.on_record(record)

    workers = [asyncio.create_task(worker()) for _ in range(max(width, 0))]
    try:
        if workers:
            done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
    finally:
        for task in workers:
            task.cancel()
        await finish(asyncio.gather(*workers, return_exceptions=True))
    return sorted(progress.records, key=lambda r: r.index) if progress.keep_records else []


async def finish(awaitable: Awaitable[T]) -> T:
    """Await `awaitable` to its end even if the caller is cancelled meanwhile (again and again:
    asyncio.run cancels what is left at exit); the cancellation is raised once it is done.

    This is what makes teardown (a runtime's `stop()`) complete on every exit path.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            # Set first: a cancellation that lands as the work ends is raised too, not lost.
            cancelled = True
            if task.done():
                if task.cancelled():
                    raise
                result = task.result()
                break
    if cancelled:
        raise asyncio.CancelledError
    return result


async def _run_one(plan: RolloutPlan, index: int, origin: float) -> RolloutRecord:
    record = RolloutRecord(
        id=f"{plan.run_id}-{index}",
        benchmark=plan.benchmark,
        index=index,
        runtime=plan.runtime_name,
        started_at=time.time(),
    )
    ctx = RolloutContext(index=index, record=record, client=plan.client, run_dir=plan.run_dir)
    if plan.make_runtime is not None:
        ctx._restart = lambda c: _restart_runtime(plan, c)
    stage = Stage.SETUP
    task: RolloutTask | None = None
    try:
        task = plan.make_task(index)
        async with _clock(record, Stage.SETUP, origin):
            before = getattr(task, "before_runtime", None)
            if before is not None:
                await before(ctx)
            if plan.make_runtime is not None:
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
        timings = record.stages.values()
        if timings:
            record.total_s = max(t.end_s for t in timings) - min(t.start_s for t in timings)
    return record


async def _start_runtime(plan: RolloutPlan, record: RolloutRecord) -> Runtime:
    """Start a runtime, retrying up to `runtime_retries`; whatever happens to a start (it fails,
    or the run is cancelled while it is under way), that runtime's `stop()` runs to its end."""
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
