"""terminal_bench: any task in the Harbor layout (Terminal-Bench 2's), in a fresh container per
rollout, scored by the task's own tests.

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
from metrale.benchmarks.terminal_bench.rollout import TaskRollout, TaskRun, task_runtime_config
from metrale.fmt import duration_text, number_text
from metrale.plugin import (
    Descriptor,
    Metric,
    ParamSpec,
    PluginHandle,
    RunSummary,
    max_tokens_param,
)
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

    def __init__(self) -> None:
        super().__init__()
        self.task_run: TaskRun | None = None

    def extra_parameters(self) -> list[ParamSpec]:
        return [
            *once.extra_parameters(),
            max_tokens_param(4096, "the model agent's completion token cap per chat call"),
        ]  # fmt: skip

    def configured(self) -> None:
        # the task is read now: a broken task directory stops the run before any work
        self.task_run = once.task_run(self.values, max_tokens=self.values["max_tokens"])

    def needs_model(self) -> bool:
        agent: str = self.values.get("agent", "model")
        return agent == "model"

    def task_metrics(self) -> list[Metric]:
        return list(METRICS)

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        chosen = super().runtime_choice(runtime)
        once.check_runtime(chosen)
        if chosen is not None and self.task_run is not None:  # configured (a run, a cell)
            # before any work: an engine that answers, and every base image present locally
            once.check_engine(self.task_run, self.values, chosen)
        return chosen

    async def prepare(self, handle: PluginHandle) -> None:
        assert handle.runtime is not None and self.task_run is not None
        run = self.task_run
        handle.on_status("image")
        await once.build(run, self.values, handle.runtime, self.log)
        if run.agent == "model":
            run.transcripts = handle.artifacts.run_dir / "transcripts"
            await asyncio.to_thread(run.transcripts.mkdir, parents=True, exist_ok=True)
        where = handle.runtime.type
        network = "as the runtime sets it" if run.task.environment.allow_internet else "off"
        self.log(
            f"terminal_bench runs the {run.agent} agent's commands only inside the {where} "
            f"runtime (network {network})"
        )

    def runtime_for(self, config: RuntimeConfig, index: int) -> RuntimeConfig:
        assert self.task_run is not None
        return task_runtime_config(self.task_run, config)

    def make_task(self, index: int) -> TaskRollout:
        assert self.task_run is not None
        return TaskRollout(self.task_run, index)

    def summary_text(self, summary: RunSummary) -> str:
        m = summary.metrics
        reward = summary.reward_mean
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
        image = self.task_run.image if self.task_run else None
        if image is not None:
            out["image_build_s"] = image.build_s
            out["image_cached"] = 1 if image.cached else 0
            if image.export_s is not None:
                out["rootfs_export_s"] = image.export_s
        return out
