"""The ray runtime on a real two-node cluster on loopback (`ray start` twice): rollouts spread
over both nodes and `stop()` leaves no actor. One cluster for the module: Ray is heavy."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from metrale.rollout import RolloutPlan, run_rollouts  # noqa: E402
from metrale.runtime import create_runtime, runtime_config  # noqa: E402
from metrale.runtime.ray import RayRuntime  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_start(*args: str, env: dict[str, str]) -> None:
    proc = subprocess.run(
        ["ray", "start", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
         "--num-cpus=1", "--object-store-memory=100000000", *args],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ray start failed: {proc.stderr[-2000:]}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head and a second worker node on 127.0.0.1, stopped whatever happens."""
    if shutil.which("ray") is None:
        pytest.skip("the ray command is not on PATH")
    temp = tempfile.mkdtemp(prefix="metrale-ray-")
    env = {**os.environ, "RAY_ADDRESS": ""}
    port = free_port()
    address = f"127.0.0.1:{port}"
    try:
        ray_start("--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}",
                  env=env)  # fmt: skip
        ray_start(f"--address={address}", env=env)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run(["ray", "stop", "--force"], capture_output=True, timeout=120, check=False)
        shutil.rmtree(temp, ignore_errors=True)


def test_rollouts_spread_over_both_nodes_and_leave_no_actor(cluster: str, marker: str) -> None:
    config = runtime_config("ray", address=cluster, inner="subprocess")
    nodes: list[str] = []

    class Task:
        async def setup(self, ctx: object) -> None:
            rt = ctx.runtime  # type: ignore[attr-defined]
            assert isinstance(rt, RayRuntime) and rt.node_id
            nodes.append(rt.node_id)
            await rt.write("q.txt", marker)

        async def generate(self, ctx: object) -> None:
            rt = ctx.runtime  # type: ignore[attr-defined]
            result = await rt.run(f"cat q.txt; sleep {marker} &")
            assert result.stdout == marker
            ctx.record.reward = 1.0  # type: ignore[attr-defined]

        async def score(self, ctx: object) -> None:
            rt = ctx.runtime  # type: ignore[attr-defined]
            assert await rt.read("q.txt") == marker.encode()

    plan = RolloutPlan(
        benchmark="ray-test",
        count=6,
        max_concurrent=6,
        make_task=lambda i: Task(),
        make_runtime=lambda: create_runtime(config),
        runtime_name="ray",
    )
    records = asyncio.run(run_rollouts(plan))
    assert [r.error for r in records] == [None] * 6
    assert all(r.reward == 1.0 for r in records)
    assert len(set(nodes)) == 2, f"work landed on {set(nodes)}"
    assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2

    assert alive_actors() == [], "actors left after stop()"


def alive_actors(within_s: float = 15.0) -> list[str]:
    """Actor ids the GCS still calls ALIVE (no dashboard needed), waiting for kills to land."""
    from ray._private.state import actors  # the state API would need the dashboard

    deadline = time.monotonic() + within_s
    while True:
        alive = [aid for aid, info in actors().items() if info.get("State") != "DEAD"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)
