"""The rollout driver: the one engine under every rollout benchmark.

A rollout benchmark subclasses `RolloutBenchmark` and supplies only what is its own:

- `make_task(index)`: the rollout's `setup`, `generate` and `score` (see `records.RolloutTask`);
- `extra_parameters()` and `extra_axes`: its parameters beyond the standard two;
- `task_metrics()`: its declared metrics, computed from the records (`plugin.Metric`);
- `verdict(summary)`: its verdict rules; and optionally `prepare()` (once-per-run work),
  `runtime_for(config, index)` (per-rollout runtime config), `on_rollout(record)` (a log line).

The driver owns the rest: the standard parameters `rollouts` and `max_concurrent` (none =
unbounded), the lifecycle (`BenchmarkBase`), the chat client, the runtime (the runtime this
benchmark accepts, checked once on this machine, started per rollout with `--retries-runtime`
and `--runtime-rate`, stopped on every path), the records (`rollouts.jsonl`, resumable), the
standard metrics (`summary.ROLLOUT_METRICS`) and the run's `RunSummary`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar, Literal

from metrale.errors import UsageError
from metrale.fmt import number_text
from metrale.plugin import (
    STANDARD_AXES,
    BenchmarkResult,
    Check,
    Metric,
    ParamSpec,
    PluginHandle,
    RunSummary,
    Status,
    Table,
    Verdict,
    shown_stages,
)
from metrale.plugin.lifecycle import BenchmarkBase
from metrale.rollout.pool import Progress, RolloutPlan, run_rollouts
from metrale.rollout.records import RolloutRecord, RolloutTask
from metrale.rollout.summary import ROLLOUT_METRICS, build_summary, sampled
from metrale.runtime.base import Capability
from metrale.stats import Spread

if TYPE_CHECKING:
    from metrale.runtime.base import RuntimeConfig


class RolloutBenchmark(BenchmarkBase):
    """Base class of every rollout benchmark (see the module docstring)."""

    default_rollouts: ClassVar[int] = 64
    max_rollouts: ClassVar[int] = 1_000_000
    #: what a runtime must provide to run this benchmark (`Capability`); one that lacks any is
    #: refused, naming the installed runtimes that have them all
    needs: ClassVar[frozenset[Capability]] = frozenset()
    #: the runtime used when the user gives none (None: rollouts run in metrale's process)
    default_runtime: ClassVar[str | None] = None
    #: why `needs` is what it is, said when a runtime is refused
    runtime_reason: ClassVar[str] = ""
    #: its own parameters that a sweep may vary, beyond rollouts and max_concurrent
    extra_axes: ClassVar[tuple[str, ...]] = ()
    #: `metrale run --resume` may finish one of its run directories
    resumable: ClassVar[bool] = True
    #: keep every record in memory (`self.progress.records`): for few, large rollouts that the
    #: benchmark reports on one by one; memory is otherwise O(concurrency)
    keep_records: ClassVar[bool] = False
    #: a rollout's sandbox may be started ahead of it (`--runtime-pool`): False when a task
    #: prepares what its sandbox binds before the start (`before_runtime`)
    warm_pool: ClassVar[bool] = True
    #: its model rollouts run the shell agent loop (`metrale.agent`) on the rollout's chat
    #: client (`RolloutContext.client`), so serve may drive them as live sessions
    agent_loop: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.progress = Progress(keep_records=False)

    # ------------------------------------------------------------------ declarations

    def extra_parameters(self) -> list[ParamSpec]:
        return []

    def parameters(self) -> list[ParamSpec]:
        return [
            ParamSpec(name="rollouts", type="int", default=self.default_rollouts, min=1,
                      max=self.max_rollouts, help="number of rollouts"),
            ParamSpec(name="max_concurrent", type="int", default=None, min=1, nullable=True,
                      help="rollouts in flight at once; none = unbounded"),
            *self.extra_parameters(),
        ]  # fmt: skip

    def sweep_axes(self) -> list[str]:
        return [*STANDARD_AXES, *self.extra_axes]

    def task_metrics(self) -> list[Metric]:
        return []

    def metrics(self) -> list[Metric]:
        return [*ROLLOUT_METRICS, *self.task_metrics()]

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        name = runtime.type if runtime is not None else None
        if name is None and self.default_runtime is None:
            return None
        if name is None:
            from metrale.runtime.configs import runtime_config

            return runtime_config(str(self.default_runtime))
        lacking = runtime.lacks(self.needs) if runtime is not None else frozenset()
        if lacking:
            from metrale.runtime.registry import config_classes

            why = f" ({self.runtime_reason})" if self.runtime_reason else ""
            # a runtime holding another (ray) is named by its own, as `lacks` judges it
            classes = config_classes()
            accepted = [n for n, c in classes.items() if self.needs <= c.capabilities]
            holder = ""
            if runtime is not None and "inner" in type(runtime).model_fields:  # ray: its inner
                local = [n for n in accepted if Capability.REMOTE not in classes[n].capabilities]
                holder = f" (or --{name}-inner {'|'.join(local)})" if local else ""
            raise UsageError(
                f"{self.descriptor.id} cannot run in the {name} runtime{why}: it lacks "
                f"{', '.join(sorted(lacking))}; accepted: {', '.join(accepted) or '(none)'}"
                f"{holder}"
            )
        if runtime is not None and runtime.pool and not self.warm_pool:
            raise UsageError(
                f"--runtime-pool: {self.descriptor.id} prepares each sandbox's files before "
                "its start, so no sandbox can be started ahead of its rollout; accepted: "
                "--runtime-pool 0 (the default)"
            )
        return runtime

    # ------------------------------------------------------------------ what a benchmark writes

    def make_task(self, index: int) -> RolloutTask:
        raise NotImplementedError

    def runtime_for(self, config: RuntimeConfig, index: int) -> RuntimeConfig:
        """The runtime config of rollout `index` (default: the run's)."""
        return config

    def on_rollout(self, record: RolloutRecord) -> None:
        """Called as each rollout ends, before its record is written."""

    def verdict(self, summary: RunSummary) -> Verdict:
        return Verdict()

    def summary_text(self, summary: RunSummary) -> str:
        """The one-line summary of a finished run."""
        from metrale.fmt import duration_text, number_text

        return (
            f"{summary.records} rollouts, {summary.errors} errors, reward "
            f"{number_text(summary.reward_mean)}, e2e {duration_text(summary.e2e_s)}"
        )

    # ------------------------------------------------------------------ the engine

    async def load(self, handle: PluginHandle) -> None:
        self.handle = handle
        handle.on_status("load")
        if handle.runtime is not None:
            from metrale.runtime.configs import check_runtime

            # no sandbox here at all: a usage error, before work (probing may block: a thread)
            await asyncio.to_thread(check_runtime, handle.runtime)
        self.progress = Progress(keep_records=self.keep_records, metrics=sampled(self.metrics()))
        if handle.resume is not None:
            for row in handle.resume.records():
                if row.get("index") in handle.resume.indices:
                    self.progress.add(RolloutRecord.model_validate(row))
        await super().load(handle)

    def plan(self) -> RolloutPlan:
        assert self.handle is not None
        handle = self.handle
        make_runtime = None
        if handle.runtime is not None:
            from metrale.runtime.configs import runtime_factory

            make_runtime = runtime_factory(handle.runtime, self.runtime_for)

        def on_record(record: RolloutRecord) -> None:
            self.on_rollout(record)
            handle.artifacts.append_record(record)
            handle.on_progress(self.progress.done, self.values["rollouts"])

        return RolloutPlan(
            benchmark=self.descriptor.id,
            count=self.values["rollouts"],
            max_concurrent=self.values["max_concurrent"],
            make_task=self.make_task,
            make_runtime=make_runtime,
            runtime_name=handle.runtime.type if handle.runtime is not None else None,
            runtime_retries=handle.runtime_retries,
            on_record=on_record,
            run_id=handle.artifacts.run_dir.name,
            skip=handle.resume.indices if handle.resume is not None else frozenset(),
            on_warning=lambda message: self.log(message, "warn"),
            client=self.client,
            run_dir=handle.artifacts.run_dir,
            start_limit=getattr(handle.runtime, "start_limit", None),
            runtime_pool=getattr(handle.runtime, "pool", 0),
        )

    async def run(self) -> None:
        assert self.handle is not None
        self.handle.on_status("rollouts")
        await run_rollouts(self.plan(), self.progress)

    def live(self) -> BenchmarkResult:
        p = self.progress
        total = self.values["rollouts"]
        reward = number_text(p.mean_reward)
        running = {s: p.running_p50(s) for s in ("generation", "total")}
        return BenchmarkResult(
            status=Status.RUNNING,
            phase="rollouts",
            elapsed_s=self.work.elapsed_s,
            done=p.done,
            total=total,
            summary=f"{p.done}/{total} rollouts · {p.errors} errors · reward {reward}",
            logs=list(self.logs),
            errors=p.errors,
            retries=p.retries,
            reward_mean=p.mean_reward,
            running_p50_s={k: v for k, v in running.items() if v is not None},
            turns=p.turns,
        )

    def final(self) -> BenchmarkResult:
        p = self.progress
        summary = build_summary(p, self.metrics(), self.work.elapsed_s)
        summary.metrics.update(self.counters())
        if p.error_kinds:
            kinds = ", ".join(f"{k} x{v}" for k, v in sorted(p.error_kinds.items()))
            self.log(f"failed rollouts: {kinds}", "warn")
        stages = {s: Spread.of(summary.stage(s)) for s in shown_stages(summary)}
        result = BenchmarkResult(
            status=Status.COMPLETED,
            phase="done",
            elapsed_s=self.work.elapsed_s,
            done=p.done,
            total=self.values["rollouts"],
            summary=self.summary_text(summary),
            table=self.table(summary, stages),
            metrics=summary.metrics,
            stages=stages,
            verdict=self.verdict(summary),
            logs=list(self.logs),
            measured=summary,
        )
        if p.done == 0:
            result.status, result.error = Status.FAILED, "no rollout ran"
        return result

    def table(self, summary: RunSummary, stages: dict[str, Spread]) -> Table:
        """The run's table: e2e, errors, reward, the stages, and each declared column, in the
        numbers of `metrale.fmt` (the same as `metrale report`'s)."""
        from metrale.fmt import duration_unit, in_unit, number_text, spread_unit

        extra = [m for m in self.task_metrics() if m.column]
        e2e_unit = duration_unit([summary.e2e_s])
        columns = [f"e2e ({e2e_unit})", "err", "rew"]
        cells: list[object] = [
            in_unit(summary.e2e_s, e2e_unit),
            summary.errors,
            number_text(summary.reward_mean),
        ]
        for s in stages:
            unit = spread_unit([stages[s]])
            columns.append(f"{s} ({unit})")
            cells.append(stages[s].cell(unit))
        columns += [f"{m.name} ({m.unit})" for m in extra]
        cells += [number_text(summary.metrics.get(m.name)) for m in extra]
        return Table(columns=columns, rows=[cells])

    def counters(self) -> dict[str, float | int | None]:
        """Run-level counts beside the declared metrics (not compared, not budgeted)."""
        p = self.progress
        return {
            "rollouts": p.done,
            "runtime_retries": p.runtime_retries,
            "prompt_tokens": p.prompt_tokens,
            "completion_tokens": p.completion_tokens,
            "tokens_counted": 1 if "counted" in p.token_sources else 0,
        }


def bound_check(
    metric: str, value: float | None, limit: float, op: Literal["<=", ">="] = "<="
) -> Check:
    """One verdict check of a benchmark's own budget parameter; an absent value fails."""
    if value is None:
        return Check(metric=metric, op=op, limit=limit, value=None, passed=False, reason="absent")
    passed = value <= limit if op == "<=" else value >= limit
    return Check(metric=metric, op=op, limit=limit, value=value, passed=passed)
