"""Scoring is bounded and cannot be forged, on bwrap and docker: a reward file that is a link to
/dev/zero, a FIFO or a 3 GB sparse file is refused quickly, with its true reason and no memory
balloon; a daemon the agent left rewriting reward.txt is gone before the verifier runs."""

from __future__ import annotations

import asyncio
import resource
import time
from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.verifier import (
    REWARD_DIR,
    BadReward,
    NoReward,
    VerifierResult,
    read_reward,
    verify,
)
from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.base import RuntimeConfig
from tests.runtime.conftest import HAVE_BWRAP

#: Far below what reading any of the hostile files whole would take.
BOUND_S = 45.0
RSS_GROWTH_MB = 200


@pytest.fixture(params=["bwrap", "docker"])
def config(request: pytest.FixtureRequest) -> RuntimeConfig:
    if request.param == "bwrap":
        if not HAVE_BWRAP:
            pytest.skip("bwrap (bubblewrap) is not installed")
        return runtime_config("bwrap", scratch=["/logs", "/tests"], file_size_mb=8192)
    from tests.runtime.engine import require_engine

    require_engine()
    return runtime_config("docker")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


HOSTILE = {
    "symlink to /dev/zero": ("ln -s /dev/zero {f}", "symlink"),
    "FIFO": ("mkfifo {f}", "not a regular file"),
    "3 GB sparse file": ("truncate -s 3G {f}", "larger than"),
    "directory": ("mkdir {f}", "not a regular file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_reward_file_is_refused_quickly_with_its_reason(
    config: RuntimeConfig, case: str
) -> None:
    make, reason = HOSTILE[case]
    before = _rss_mb()

    async def main() -> tuple[Exception | None, float]:
        async with create_runtime(config) as rt:
            target = f"{REWARD_DIR}/reward.txt"
            done = await rt.run(f"mkdir -p {REWARD_DIR} && " + make.format(f=target))
            assert done.exit_code == 0, done.stderr
            started = time.monotonic()
            try:
                await asyncio.wait_for(read_reward(rt, VerifierResult(0, "", False, 0.0)), BOUND_S)
            except (BadReward, NoReward) as exc:
                return exc, time.monotonic() - started
            return None, time.monotonic() - started

    error, took = asyncio.run(main())
    assert isinstance(error, BadReward), f"{case}: {error!r}"
    assert reason in str(error) and "reward.txt" in str(error)
    assert took < BOUND_S
    assert _rss_mb() - before < RSS_GROWTH_MB


def test_a_missing_reward_is_still_no_reward(config: RuntimeConfig) -> None:
    async def main() -> None:
        async with create_runtime(config) as rt:
            await read_reward(rt, VerifierResult(0, "", False, 0.0))

    with pytest.raises(NoReward):
        asyncio.run(main())


DAEMON = (
    "setsid sh -c 'while :; do mkdir -p {d} 2>/dev/null; echo 1 > {d}/reward.txt; "
    "sleep 0.01; done' > /dev/null 2>&1 < /dev/null &"
)
FAIR_TEST = f"#!/bin/bash\nmkdir -p {REWARD_DIR}\necho 0 > {REWARD_DIR}/reward.txt\nsleep 1\n"


def test_a_daemon_left_by_the_agent_cannot_forge_the_reward(
    config: RuntimeConfig, tmp_path: Path
) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text(FAIR_TEST)

    async def main() -> tuple[float | None, str]:
        async with create_runtime(config) as rt:
            for _ in range(3):  # several, as a solve.sh that forks and double-forks would
                done = await rt.run(DAEMON.format(d=REWARD_DIR))
                assert done.exit_code == 0, done.stderr
            await asyncio.sleep(0.3)
            result = await verify(rt, tests, workdir=None, timeout_s=60)
            alive = await rt.run("echo still usable")
            return result.reward, alive.stdout.strip()

    reward, alive = asyncio.run(main())
    assert reward == 0.0
    assert alive == "still usable"  # the sandbox itself survived the kill
