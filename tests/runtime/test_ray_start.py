"""A ray runtime whose sandbox fails to start gives its actor (and the CPU it holds) back
without its caller's `stop()`: the promise every runtime makes in `base`, at the step where
ray's start can fail after it has made something (the actor exists, its sandbox did not
start). `test_start_cleanup.py` holds the bwrap and subprocess cases."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.base import RuntimeStartError
from metrale.runtime.procs import kill_tree
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed"),
]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A one-node Ray head on loopback in its own temp dir, stopped by its own pids (as
    test_conformance's, which this module does not import: it asks the container engine)."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip("no ray command next to this interpreter")
    temp = tempfile.mkdtemp(prefix="metrale-ray-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_ADDRESS": "", "METRALE_TEST_RAY": temp}
    try:
        subprocess.run(
            [str(ray_bin), "start", "--head", "--disable-usage-stats", f"--port={port}",
             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
             "--object-store-memory=100000000", f"--temp-dir={temp}"],
            capture_output=True, text=True, timeout=180, env=env, check=True,
        )  # fmt: skip
        yield f"127.0.0.1:{port}"
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        kill_tree([], marker=f"METRALE_TEST_RAY={temp}".encode())
        shutil.rmtree(temp, ignore_errors=True)


def test_a_ray_sandbox_that_fails_to_start_gives_its_actor_back(
    ray_cluster: str, tmp_path: Path
) -> None:
    import ray

    config = runtime_config(
        "ray", address=ray_cluster, inner="bwrap", actor_cpus=2,
        binds=[{"src": str(tmp_path / "no-such-dir"), "dst": "/data"}],
    )  # fmt: skip
    runtime = create_runtime(config)
    with pytest.raises(RuntimeStartError, match="did not start"):
        asyncio.run(runtime.start())
    # the actor asked for both CPUs of the cluster: they are free again once it is gone
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == 2, "the failed start kept its actor"
