"""Each task shipped with metrale is valid: its oracle scores 1.0 and an agent that does
nothing scores 0.0, in a real container (and fix-git in a real bwrap sandbox over the image's
root too)."""

from __future__ import annotations

import asyncio
import time

import pytest

from metrale.agent import AgentConfig
from metrale.benchmarks.terminal_bench.images import ensure_image, export_rootfs
from metrale.benchmarks.terminal_bench.rollout import TaskRollout, TaskRun, task_runtime_config
from metrale.benchmarks.terminal_bench.task import load_task, shipped_task_names
from metrale.rollout import RolloutContext, RolloutRecord
from metrale.runtime import create_runtime, runtime_config
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.engine import require_engine


async def _score(name: str, runtime: str, agent: str) -> RolloutRecord:
    task = load_task(name)
    run = TaskRun(task=task, agent=agent, agent_timeout_s=120, verifier_timeout_s=60,
                  agent_config=AgentConfig())  # fmt: skip
    run.image = await ensure_image(task, "docker", {}, build_timeout_s=300)
    if runtime == "bwrap":
        await export_rootfs(run.image, "docker")
    config = task_runtime_config(run, runtime_config(runtime))
    record = RolloutRecord(id="t-0", benchmark="terminal_bench", index=0, started_at=time.time())
    ctx = RolloutContext(index=0, record=record)
    rollout = TaskRollout(run, 0)
    async with create_runtime(config) as rt:
        ctx.runtime = rt
        await rollout.setup(ctx)
        await rollout.generate(ctx)
        await rollout.score(ctx)
    return record


CASES = [(name, "docker") for name in shipped_task_names()] + [("fix-git", "bwrap")]


@pytest.mark.parametrize(("name", "runtime"), CASES)
def test_the_oracle_passes_and_doing_nothing_fails(name: str, runtime: str) -> None:
    require_engine()
    if runtime == "bwrap" and not HAVE_BWRAP:
        pytest.skip("bwrap (bubblewrap) is not installed")
    oracle = asyncio.run(_score(name, runtime, "oracle"))
    assert oracle.error is None, oracle.error
    assert oracle.reward == 1.0, oracle.metrics.get("verifier_output")
    assert oracle.metrics["agent_exit_code"] == 0
    assert oracle.metrics["verifier_exit_code"] == 0
    assert oracle.metrics["timeout"] is None
    nothing = asyncio.run(_score(name, runtime, "nop"))
    assert nothing.error is None, nothing.error
    assert nothing.reward == 0.0
    assert "FAIL" in nothing.metrics["verifier_output"]
