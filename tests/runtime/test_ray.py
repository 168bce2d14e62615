"""The ray runtime on a real two-node cluster on loopback (`ray start` twice): rollouts spread
over both nodes and `stop()` leaves no actor. One cluster for the module: Ray is heavy."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from metrale.rollout import RolloutPlan, run_rollouts  # noqa: E402
from metrale.runtime import create_runtime, runtime_config  # noqa: E402
from metrale.runtime.ray import RayRuntime  # noqa: E402
from metrale.runtime.ray_cluster import _reload_ray_auth as reload_ray_auth  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_command() -> str | None:
    """`ray` next to the running interpreter (an unactivated venv), else on PATH."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray")


def ray_start(*args: str, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [str(ray_command()), "start", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
         "--num-cpus=1", "--object-store-memory=100000000", *args],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ray start failed: {proc.stderr[-2000:]}")


#: Token auth settings the cluster, its workers and this process all share.
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "HOME")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head and a second worker node on 127.0.0.1, stopped whatever happens.

    The cluster and this process use a token of their own, given in the environment, and a
    HOME holding a *stale* ~/.ray/auth_token (what an earlier Ray run leaves): the test must
    pass on a machine where Ray was used before.
    """
    if ray_command() is None:
        pytest.skip("the ray command is not installed")
    temp = tempfile.mkdtemp(prefix="metrale-ray-")
    home = Path(temp) / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)  # stale: no cluster knows it
    saved = {name: os.environ.get(name) for name in AUTH_ENV}
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "HOME": str(home)}
    os.environ.update(auth)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    reload_ray_auth()  # ray was imported above: it must see the settings of this cluster
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
        subprocess.run([str(ray_command()), "stop", "--force"], capture_output=True, timeout=120,
                       check=False, env=env)  # fmt: skip
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        reload_ray_auth()
        shutil.rmtree(temp, ignore_errors=True)


def test_local_cluster_leaves_no_state_behind(tmp_path: Path) -> None:
    """`--ray-address local`: no ~/.ray/auth_token, no temp dir, no Ray process afterwards."""
    from tests.conftest import start_sim

    home = tmp_path / "home"
    home.mkdir()
    temp = Path(tempfile.mkdtemp(prefix="mt-", dir="/tmp"))  # short: Ray's sockets live below

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), TMPDIR=str(temp), RAY_ADDRESS="")
    with start_sim() as sim:
        proc = subprocess.run(
            [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", sim.url,
             "--no-preflight", "--runtime", "ray", "--ray-address", "local",
             "--rollouts", "2", "--max-tokens", "4", "--out", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not (home / ".ray").exists(), list((home / ".ray").rglob("*"))
        assert list(temp.glob("metrale-ray-*")) == []
    finally:
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
        make_runtime=lambda _index: create_runtime(config),
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
