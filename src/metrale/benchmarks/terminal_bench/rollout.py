"""One terminal_bench rollout's three stages, and the runtime config each rollout gets.

- **setup**: the driver starts a fresh container (or bwrap sandbox over the task image's
  root); nothing else, so setup is the container start. A failed image build is raised here,
  as `image_build`, on every rollout.
- **generation**: the agent (`oracle`: solve.sh with `[solution.env]`; `model`: the shell
  agent loop) under the agent timeout, starting in task.toml's `[environment] workdir`, else
  the image's WORKDIR.
- **scoring**: the verifier (tests/ copied to /tests now, test.sh under the verifier timeout,
  with `[verifier.env]`); reward = the number test.sh wrote.

A record keeps: `turns` and tokens (model), and in `metrics` the agent's kind, exit and
duration, tool calls, turn-cap and parse counters, the verifier's exit code and output (capped),
reward.json's named rewards, and `timeout` ("agent", "verifier" or None): which one fired.
An agent timeout is recorded as the error `agent_timeout` (stage generation) after the verifier
has scored what the agent left.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metrale.agent import AgentConfig
from metrale.benchmarks.terminal_bench.agents import (
    AgentOutcome,
    AgentTimeout,
    nop_outcome,
    run_model,
    run_oracle,
)
from metrale.benchmarks.terminal_bench.images import TaskImage
from metrale.benchmarks.terminal_bench.task import HarborTask
from metrale.benchmarks.terminal_bench.verifier import TESTS_DIR, verify
from metrale.rollout import ErrorInfo, RolloutContext
from metrale.runtime.base import RuntimeConfig, TaskSandbox

#: Writable dirs a sandbox over a read-only image root needs besides its workdir.
SCRATCH = ("/logs", TESTS_DIR, "/solution")


@dataclass
class TaskRun:
    """What every rollout of one run shares: the task, its image, the agent and its limits."""

    task: HarborTask
    agent: str
    agent_timeout_s: float
    verifier_timeout_s: float
    agent_config: AgentConfig
    image: TaskImage | None = None
    build_error: Exception | None = None
    transcripts: Path | None = None

    def workdir(self, config: RuntimeConfig | None = None) -> str | None:
        """Where the agent starts: the runtime's workdir as the task set it, else the image's."""
        inner = getattr(config, "inner", config)
        workdir = getattr(inner, "workdir", None)
        if isinstance(workdir, str):
            return workdir
        return self.image.workdir if self.image else None

    def sandbox(self) -> TaskSandbox:
        """What this task asks of its sandboxes, for the runtime to fold into its config."""
        image, env = self.image, self.task.environment
        return TaskSandbox(
            image=image.tag if image else None,
            rootfs=str(image.rootfs) if image and image.rootfs else None,
            context=str(self.task.path / "environment"),
            workdir=env.workdir or (image.workdir if image else None),
            env=dict(image.env) if image else {},
            cpus=env.cpus,
            memory_mb=env.memory_mb,
            internet=env.allow_internet,
            scratch=SCRATCH,
        )


def task_runtime_config(run: TaskRun, config: RuntimeConfig) -> RuntimeConfig:
    """`config` (the user's runtime) adjusted for the task by the runtime itself
    (`RuntimeConfig.for_task`): its image or image root, WORKDIR and ENV, the limits of
    task.toml, and no network at all unless the task allows internet."""
    return config.for_task(run.sandbox())


class TaskRollout:
    """The three stages of one rollout of `run`."""

    def __init__(self, run: TaskRun, index: int) -> None:
        self.run, self.index = run, index
        self.outcome: AgentOutcome | None = None

    async def setup(self, ctx: RolloutContext) -> None:
        if self.run.build_error is not None:
            log = getattr(self.run.build_error, "log", "")
            if log:
                ctx.record.metrics["build_log"] = log
            raise self.run.build_error
        if self.run.image is not None:
            ctx.record.metrics.update(image=self.run.image.tag)
        skipped = getattr(ctx.runtime, "seed_skipped", None)
        if skipped:  # device nodes, FIFOs, sockets of the image's WORKDIR (bwrap): not copied
            ctx.record.metrics["workdir_skipped"] = skipped[:20]

    async def generate(self, ctx: RolloutContext) -> None:
        run, runtime = self.run, ctx.runtime
        assert runtime is not None
        workdir = run.workdir(getattr(runtime, "config", None))
        if run.agent == "nop":
            self.outcome = nop_outcome()
        elif run.agent == "oracle":
            self.outcome = await run_oracle(
                runtime, run.task, workdir=workdir, timeout_s=run.agent_timeout_s,
                env=run.task.solution_env,
            )  # fmt: skip
        else:
            assert ctx.client is not None, "agent=model needs the run's chat client"
            transcript = run.transcripts / f"{self.index}.jsonl" if run.transcripts else None
            self.outcome = await run_model(
                runtime, run.task, ctx.client, run.agent_config, workdir=workdir,
                timeout_s=run.agent_timeout_s, transcript=transcript,
            )  # fmt: skip
        fill_agent(ctx, self.outcome)

    async def score(self, ctx: RolloutContext) -> None:
        run, runtime = self.run, ctx.runtime
        assert runtime is not None and self.outcome is not None
        workdir = run.workdir(getattr(runtime, "config", None))
        metrics = ctx.record.metrics
        try:
            result = await verify(
                runtime, run.task.tests_dir, workdir=workdir, timeout_s=run.verifier_timeout_s,
                env=run.task.verifier_env,
            )  # fmt: skip
        except Exception as exc:
            partial = getattr(exc, "result", None)
            if partial is not None:
                metrics.update(verifier_exit_code=partial.exit_code, verifier_output=partial.output,
                               verifier_s=partial.duration_s)  # fmt: skip
                if partial.timed_out:
                    metrics["timeout"] = "verifier"
            raise
        ctx.record.reward = result.reward
        metrics.update(
            verifier_exit_code=result.exit_code,
            verifier_output=result.output,
            verifier_s=result.duration_s,
        )
        if result.rewards:
            metrics["rewards"] = result.rewards
        if self.outcome.timed_out:
            err = AgentTimeout(f"the agent ran past the agent timeout of {run.agent_timeout_s:g} s")
            ctx.record.error = ErrorInfo(type=err.kind, message=str(err), stage="generation")


def fill_agent(ctx: RolloutContext, outcome: AgentOutcome) -> None:
    record, metrics = ctx.record, ctx.record.metrics
    metrics.update(agent=outcome.agent, agent_s=outcome.duration_s, timeout=None)
    if outcome.timed_out:
        metrics["timeout"] = "agent"
    if outcome.agent != "model":
        metrics.update(agent_exit_code=outcome.exit_code, agent_output=outcome.output,
                       tool_calls=0)  # fmt: skip
        return
    stats = outcome.stats
    assert stats is not None
    record.turns = stats.turns
    record.tokens.completion = stats.completion_tokens
    record.tokens.prompt = outcome.prompt_tokens
    metrics.update(stats.record_metrics())
