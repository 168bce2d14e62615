"""The two agents a Harbor task can be given: `oracle` (the task's own solution/solve.sh, no
model) and `model` (metrale's shell agent loop with the bash tool), both under the task's agent
timeout and both run only inside the rollout's runtime.

An agent that runs past its timeout is stopped (the oracle's command is killed inside the
sandbox; the model loop is cancelled, which kills the command in flight) and the outcome says
so; the verifier still runs, as Harbor does, since what the agent did may already pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from metrale.agent import Agent, AgentConfig, AgentStats, Chat
from metrale.benchmarks.terminal_bench.task import HarborTask
from metrale.benchmarks.terminal_bench.verifier import copy_dir, keep
from metrale.runtime.base import Runtime

SOLUTION_DIR = "/solution"
#: `nop` does nothing (Harbor's name): a task's tests must fail it, or they prove nothing.
AGENTS = ("model", "oracle", "nop")


class AgentTimeout(Exception):
    """The agent ran past the task's agent timeout (recorded after scoring)."""

    kind = "agent_timeout"


@dataclass
class AgentOutcome:
    agent: str
    timed_out: bool
    duration_s: float
    #: solve.sh's exit code (oracle), or None
    exit_code: int | None = None
    #: solve.sh's output, capped (oracle)
    output: str = ""
    #: the loop's counters (model)
    stats: AgentStats | None = None
    prompt_tokens: int | None = None


async def run_oracle(
    runtime: Runtime,
    task: HarborTask,
    *,
    workdir: str | None,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> AgentOutcome:
    """Copy solution/ to /solution and run solve.sh there as Harbor's oracle does, with
    task.toml's `[solution.env]` added to its environment."""
    started = time.perf_counter()
    await copy_dir(runtime, task.solution_dir, SOLUTION_DIR)
    result = await runtime.run(
        ["bash", f"{SOLUTION_DIR}/solve.sh"], cwd=workdir, timeout=timeout_s, env=env or None
    )
    return AgentOutcome(
        agent="oracle",
        timed_out=result.timed_out,
        duration_s=time.perf_counter() - started,
        exit_code=result.exit_code,
        output=keep(result.stdout + result.stderr),
    )


def nop_outcome() -> AgentOutcome:
    return AgentOutcome(agent="nop", timed_out=False, duration_s=0.0)


async def run_model(
    runtime: Runtime,
    task: HarborTask,
    client: Chat,
    config: AgentConfig,
    *,
    workdir: str | None,
    timeout_s: float,
    transcript: Path | None,
) -> AgentOutcome:
    """The agent loop on the task's instruction, verbatim, until it submits, hits its turn cap
    or the agent timeout."""
    started = time.perf_counter()
    agent = Agent(client, runtime, config, cwd=workdir, transcript=transcript)
    timed_out = False
    try:
        await asyncio.wait_for(agent.run(task.instruction), timeout_s)
    except TimeoutError:
        timed_out = True
        agent.stats.exit_status = "agent_timeout"
        agent.add({"role": "exit", "content": f"agent timeout of {timeout_s:g} s",
                   "extra": {"exit": "agent_timeout"}})  # fmt: skip
    prompt = [m.get("extra", {}).get("prompt_tokens") for m in agent.messages]
    counted = [p for p in prompt if isinstance(p, int)]
    return AgentOutcome(
        agent="model",
        timed_out=timed_out,
        duration_s=time.perf_counter() - started,
        stats=agent.stats,
        prompt_tokens=sum(counted) if counted else None,
    )
