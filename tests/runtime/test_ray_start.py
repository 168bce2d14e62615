"""A ray runtime whose sandbox fails to start gives its actor (and the CPU it holds) back
without its caller's `stop()`: the promise every runtime makes in `base`, at the step where
ray's start can fail after it has made something (the actor exists, its sandbox did not
start). `test_start_cleanup.py` holds the bwrap and subprocess cases."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.base import RuntimeStartError
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed"),
]


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
