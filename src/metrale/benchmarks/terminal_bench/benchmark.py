"""terminal_bench: any task in the Harbor layout (Terminal-Bench 2's), or a directory of them
(a dataset, `dataset.py`), in a fresh container per rollout, scored by the task's own tests.

A run is tasks x attempts rollouts: rollout `i` is attempt `i % attempts` of task
`(i // attempts) mod tasks`, and its record names both (`metrics.task`, `metrics.attempt`). The
mod matters to a caller that runs rollouts past the run's count (serve's live sessions: session
`k` runs task `k mod tasks`, in the dataset's order). The summary
keeps a `TaskSummary` per task (`RunSummary.per_task`: attempts, reward, pass@1, pass@k,
errors by type, stage p50s, or why the task was skipped) and the dataset's numbers (pass@1,
pass@k, tasks solved) among its metrics.

A rollout benchmark on the one engine (`metrale.rollout.RolloutBenchmark`). Once per run
(`prepare`, before the rollouts, timed and logged apart): read the task, build its image (or
reuse it by hash), export its root for bwrap. Per rollout: **setup** = the container start;
**generation** = the agent under the agent timeout; **scoring** = tests/test.sh under the
verifier timeout; reward = the number test.sh wrote (see `rollout.py`).

Runtimes: `docker` (default; the task image, its WORKDIR, ENV, cpus and memory), `bwrap` (the
image's exported root as the sandbox's system, its WORKDIR as a writable copy), `ray` over
bwrap. `subprocess` is refused: a task needs its own image's file system. With `agent=oracle`
(or `nop`) no model is called: no target, probe, preflight or embedded model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar

from metrale.benchmarks.terminal_bench import prepare as once
from metrale.benchmarks.terminal_bench.dataset import Entry, Tally, is_dataset
from metrale.benchmarks.terminal_bench.rollout import TaskRollout, TaskRun, task_runtime_config
from metrale.errors import UsageError
from metrale.fmt import duration_text, number_text
from metrale.plugin import (
    BenchmarkResult,
    Descriptor,
    Metric,
    ParamSpec,
    PluginHandle,
    RunSummary,
    max_tokens_param,
)
from metrale.plugin.per_task import dataset_line, dataset_numbers
from metrale.rollout import RolloutBenchmark, RolloutRecord
from metrale.runtime.base import Capability, RuntimeConfig


def _num(key: str) -> Callable[[RolloutRecord], float | None]:
    def value(r: RolloutRecord) -> float | None:
        x = r.metrics.get(key)
        return None if x is None or isinstance(x, bool | str) else float(x)

    return value


def _flag(key: str, expect: object = True) -> Callable[[RolloutRecord], float]:
    return lambda r: 1.0 if r.metrics.get(key) == expect else 0.0


METRICS: tuple[Metric, ...] = (
    Metric("passed", "rollouts", "higher", stat="sum",
           value=lambda r: 1.0 if r.reward is not None and r.reward >= 1.0 else 0.0,
           doc="rollouts whose reward is 1 (or more): the task solved"),
    Metric("turns", "turns", None, stat="mean", value=lambda r: r.turns, column=True,
           doc="mean over model-agent rollouts of chat calls answered (the oracle has none)"),
    Metric("tool_calls", "calls", None, stat="mean", value=_num("tool_calls"),
           doc="mean over rollouts of commands the agent ran (0 for the oracle and nop)"),
    Metric("agent_s", "s", "lower", stat="p50", value=_num("agent_s"),
           doc="p50 of the agent's time: solve.sh, or the agent loop from its first chat call "
           "to its last command (inside generation, which also copies solution/ in)"),
    Metric("verifier_s", "s", "lower", stat="p50", value=_num("verifier_s"),
           doc="p50 of test.sh's own run time (inside scoring, which also copies tests/ in)"),
    Metric("agent_timeouts", "rollouts", "lower", stat="sum", value=_flag("timeout", "agent"),
           doc="rollouts whose agent ran past the agent timeout"),
    Metric("verifier_timeouts", "rollouts", "lower", stat="sum",
           value=_flag("timeout", "verifier"),
           doc="rollouts whose test.sh ran past the verifier timeout"),
    Metric("s_per_turn", "s", "lower", stat="ratio", value=_num("agent_s"),
           per=lambda r: r.turns if r.turns else None,
           doc="sum of agent time / sum of turns over model-agent rollouts"),
    Metric("pass_at_1", "fraction", "higher", stat="value", column=True,
           doc="mean over the tasks that ran of c/n: a task's passed attempts (reward >= 1) "
           "over its attempts"),
    Metric("pass_at_k", "fraction", "higher", stat="value", column=True,
           doc="mean over the tasks that ran of the unbiased pass@k, 1 - C(n-c, k)/C(n, k), "
           "k = the run's attempts per task"),
    Metric("tasks_solved", "tasks", "higher", stat="value",
           doc="tasks with at least one passed attempt"),
)  # fmt: skip


class TerminalBenchBenchmark(RolloutBenchmark):
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="terminal_bench",
        name="Terminal-Bench (Harbor tasks)",
        summary="A task in the Harbor layout (instruction, Dockerfile, tests) in a fresh "
        "container per rollout: an agent (a model, or the task's oracle solution) works in "
        "it, then the task's tests score what it left.",
    )
    default_rollouts: ClassVar[int] = 1
    max_rollouts: ClassVar[int] = 100_000
    needs: ClassVar[frozenset[Capability]] = once.NEEDS
    default_runtime: ClassVar[str | None] = "docker"
    runtime_reason: ClassVar[str] = once.RUNTIME_REASON
    keep_records: ClassVar[bool] = False
    extra_axes: ClassVar[tuple[str, ...]] = ("agent", "max_turns", "task")
    agent_loop: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[Entry] = []
        self.runs: list[TaskRun] = []
        self.attempts = 1
        self.tally: Tally | None = None

    @property
    def task_run(self) -> TaskRun | None:
        """The run's first (for one task, its only) task."""
        return self.runs[0] if self.runs else None

    def extra_parameters(self) -> list[ParamSpec]:
        return [
            *once.extra_parameters(),
            max_tokens_param(4096, "the model agent's completion token cap per chat call"),
        ]  # fmt: skip

    def configured(self) -> None:
        # the tasks are read now: a broken task directory stops the run before any work
        self.entries, self.runs = once.task_runs(self.values, max_tokens=self.values["max_tokens"])
        single = len(self.entries) == 1 and not is_dataset(str(self.values["task"]))
        attempts = self.values.get("attempts")
        rollouts = int(self.values["rollouts"])
        if single:
            self.attempts = int(attempts) if attempts else rollouts
        else:
            self.attempts = int(attempts or 1)
            if rollouts not in (1, len(self.runs) * self.attempts):
                raise UsageError(
                    f"--rollouts {rollouts}: a dataset runs tasks x attempts rollouts "
                    f"({len(self.runs)} x {self.attempts}); accepted: --attempts K"
                )
        self.values["attempts"] = self.attempts
        self.count()

    def count(self) -> None:
        """The rollouts and the tally of the runs that run (after any task was skipped)."""
        self.values["rollouts"] = len(self.runs) * self.attempts
        self.tally = Tally(
            attempts=self.attempts,
            names=[e.name for e in self.entries],
            skipped={e.name: e.skipped for e in self.entries if e.skipped is not None},
        )

    def run_of(self, index: int) -> TaskRun:
        return self.runs[(index // self.attempts) % len(self.runs)]

    def needs_model(self) -> bool:
        agent: str = self.values.get("agent", "model")
        return agent == "model"

    def task_metrics(self) -> list[Metric]:
        return list(METRICS)

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        chosen = super().runtime_choice(runtime)
        once.check_runtime(chosen)
        if chosen is not None and self.runs:  # configured (a run, a cell)
            # a task whose allow_internet this runtime cannot follow exactly does not run
            runs = once.refuse_by_network(self.entries, self.runs, self.values, chosen)
            if runs != self.runs:
                self.runs = runs
                self.count()
            # before any work: an engine that answers, and every base image present locally
            once.check_engine(self.runs, self.values, chosen)
        return chosen

    async def load(self, handle: PluginHandle) -> None:
        await super().load(handle)
        if handle.resume is not None and self.tally is not None:  # the records kept
            for row in handle.resume.records():
                if row.get("index") in handle.resume.indices:
                    self.on_rollout(RolloutRecord.model_validate(row))

    async def prepare(self, handle: PluginHandle) -> None:
        assert handle.runtime is not None and self.runs
        handle.on_status("image")
        await once.build_all(self.runs, self.values, handle.runtime, self.log)
        run = self.runs[0]
        if run.agent == "model":
            transcripts = handle.artifacts.run_dir / "transcripts"
            await asyncio.to_thread(transcripts.mkdir, parents=True, exist_ok=True)
            for each in self.runs:
                each.transcripts = transcripts
        unbounded = sorted(r.task.name for r in self.runs if r.task.environment.storage_mb)
        if unbounded:
            names = ", ".join(unbounded[:5])
            self.log(f"storage_mb is not enforced by the {handle.runtime.type} runtime "
                     f"(tasks {names}); see docs/runtimes.md", "warn")  # fmt: skip
        where = handle.runtime.type
        online = sum(1 for r in self.runs if r.task.environment.allow_internet)
        self.log(
            f"terminal_bench runs the {run.agent} agent's commands only inside the {where} "
            f"runtime ({len(self.runs)} tasks x {self.attempts} attempts; by allow_internet, "
            f"network off for {len(self.runs) - online} of them, the runtime's for {online})"
        )

    def runtime_for(self, config: RuntimeConfig, index: int) -> RuntimeConfig:
        return task_runtime_config(self.run_of(index), config)

    def make_task(self, index: int) -> TaskRollout:
        return TaskRollout(self.run_of(index), index)

    def on_rollout(self, record: RolloutRecord) -> None:
        run = self.run_of(record.index)
        record.metrics.update(task=run.task.name, attempt=record.index % self.attempts)
        if self.tally is not None:
            self.tally.add(run.task.name, record)

    def final(self) -> BenchmarkResult:
        result = super().final()
        if result.measured is not None and self.tally is not None:
            result.measured.per_task = self.tally.summaries()
        return result

    def summary_text(self, summary: RunSummary) -> str:
        m = summary.metrics
        reward = summary.reward_mean
        if len(self.entries) > 1 and self.tally is not None:
            return dataset_line(self.tally.summaries(), self.attempts) + (
                f" · e2e {duration_text(summary.e2e_s)}"
            )
        image = self.task_run.image if self.task_run else None
        build = (
            ""
            if image is None
            else f" · image {'cached' if image.cached else f'built {image.build_s:.1f} s'}"
        )
        return (
            f"{summary.records} rollouts · {number_text(m.get('passed') or 0)} passed · "
            f"reward {number_text(reward)} · {summary.errors} errors · "
            f"e2e {duration_text(summary.e2e_s)}{build}"
        )

    def counters(self) -> dict[str, float | int | None]:
        out = super().counters()
        if self.tally is not None:
            out.update(dataset_numbers(self.tally.summaries(), self.attempts))
        images = {r.image.tag: r.image for r in self.runs if r.image is not None}
        if len(images) > 1:
            built = [i for i in images.values() if not i.cached]
            out["images"] = len(images)
            out["image_build_s"] = sum(i.build_s for i in built)
            out["image_cached"] = len(images) - len(built)
            return out
        image = self.task_run.image if self.task_run else None
        if image is not None:
            out["image_build_s"] = image.build_s
            out["image_cached"] = 1 if image.cached else 0
            if image.export_s is not None:
                out["rootfs_export_s"] = image.export_s
        return out
