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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, Field

from metrale.runtime.base import Runtime
from metrale.stats import Spread


class Stage(StrEnum):
    SETUP = "setup"
    GENERATION = "generation"
    SCORING = "scoring"


STAGES: tuple[Stage, ...] = (Stage.SETUP, Stage.GENERATION, Stage.SCORING)
#: The stage columns every summary shows, in order.
SUMMARY_STAGES: tuple[str, ...] = (*STAGES, "total")


class StageTiming(BaseModel):
    started_at: float = Field(description="wall-clock start, epoch seconds")
    start_s: float = Field(description="monotonic start, seconds since the run began")
    end_s: float
    duration_s: float


class Tokens(BaseModel):
    prompt: int | None = None
    completion: int | None = None
    source: str | None = Field(default=None, description="'usage' (server) or 'counted'")


class ErrorInfo(BaseModel):
    type: str
    message: str
    stage: str | None = None


class RolloutRecord(BaseModel):
    id: str
    benchmark: str
    index: int
    runtime: str | None = None
    started_at: float
    stages: dict[str, StageTiming] = Field(default_factory=dict)
    total_s: float | None = None
    reward: float | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    tokens: Tokens = Field(default_factory=Tokens)
    turns: int | None = None
    retries: int = 0
    runtime_retries: int = 0
    error: ErrorInfo | None = None


class RolloutTask(Protocol):
    """A benchmark's three stages for one rollout; each may read and write `ctx`."""

    async def setup(self, ctx: RolloutContext) -> None: ...

    async def generate(self, ctx: RolloutContext) -> None: ...

    async def score(self, ctx: RolloutContext) -> None: ...


@dataclass
class RolloutContext:
    index: int
    record: RolloutRecord
    runtime: Runtime | None = None
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutPlan:
    """How to run a batch: how many, how many at once, where, and who to tell."""

    benchmark: str
    count: int
    make_task: Callable[[int], RolloutTask]
    max_concurrent: int | None = None
    make_runtime: Callable[[], Runtime] | None = None
    runtime_name: str | None = None
    runtime_retries: int = 0
    on_record: Callable[[RolloutRecord], None] = lambda record: None
    run_id: str = "run"


@dataclass
class Progress:
    """Live counters the runner reads while rollouts run."""

    done: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0
    records: list[RolloutRecord] = field(default_factory=list)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None


async def run_rollouts(plan: RolloutPlan, progress: Progress | None = None) -> list[RolloutRecord]:
    """Run `plan.count` rollouts, at most `plan.max_concurrent` at once (None: unbounded)."""
    progress = progress if progress is not None else Progress()
    origin = time.perf_counter()
    gate = asyncio.Semaphore(plan.max_concurrent) if plan.max_concurrent else None

    async def one(index: int) -> None:
        if gate is None:
            record = await _run_one(plan, index, origin)
        else:
            async with gate:
                record = await _run_one(plan, index, origin)
        progress.records.append(record)
        progress.done += 1
        if record.error is not None:
            progress.errors += 1
        if record.reward is not None:
            progress.reward_sum += record.reward
            progress.rewarded += 1
        plan.on_record(record)

    await asyncio.gather(*(one(i) for i in range(plan.count)))
    return sorted(progress.records, key=lambda r: r.index)


async def _run_one(plan: RolloutPlan, index: int, origin: float) -> RolloutRecord:
    record = RolloutRecord(
        id=f"{plan.run_id}-{index}",
        benchmark=plan.benchmark,
        index=index,
        runtime=plan.runtime_name,
        started_at=time.time(),
    )
    ctx = RolloutContext(index=index, record=record)
    stage = Stage.SETUP
    try:
        task = plan.make_task(index)
        async with _clock(record, Stage.SETUP, origin):
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
        record.retries += int(getattr(exc, "retries", 0) or 0)
    finally:
        if ctx.runtime is not None:
            try:
                await ctx.runtime.stop()
            except Exception as exc:  # a failed teardown is the rollout's fault, not the run's
                if record.error is None:
                    record.error = ErrorInfo(type="runtime_stop", message=str(exc)[:500])
        timings = record.stages.values()
        if timings:
            record.total_s = max(t.end_s for t in timings) - min(t.start_s for t in timings)
    return record


async def _start_runtime(plan: RolloutPlan, record: RolloutRecord) -> Runtime:
    assert plan.make_runtime is not None
    attempt = 0
    while True:
        runtime = plan.make_runtime()
        try:
            await runtime.start()
            return runtime
        except Exception:
            await runtime.stop()
            if attempt >= plan.runtime_retries:
                raise
            attempt += 1
            record.runtime_retries = attempt


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


def stage_durations(records: Sequence[RolloutRecord]) -> dict[str, list[float]]:
    """Sorted per-rollout durations of each stage and of total; failed stages included."""
    out: dict[str, list[float]] = {s: [] for s in SUMMARY_STAGES}
    for r in records:
        for name, timing in r.stages.items():
            out[name].append(timing.duration_s)
        if r.total_s is not None:
            out["total"].append(r.total_s)
    return {k: sorted(v) for k, v in out.items()}


def stage_spreads(records: Sequence[RolloutRecord]) -> dict[str, Spread]:
    return {name: Spread.of(values) for name, values in stage_durations(records).items()}
