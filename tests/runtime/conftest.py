"""Runtime test helpers: a unique marker per test and a check that no process carrying it
survives the test (scanning /proc cmdlines, no psutil)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metrale.runtime import Runtime, create_runtime, runtime_config
from metrale.runtime.procs import kill_tree

HAVE_BWRAP = shutil.which("bwrap") is not None


def processes_with(marker: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every live, non-zombie process whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in ("Z", "X"):
            continue
        text = raw.replace(b"\0", b" ").decode(errors="replace")
        if marker in text:
            found.append((int(entry), text))
    return found


def wait_gone(marker: str, within_s: float = 5.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + within_s
    while True:
        left = processes_with(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture
def marker() -> Iterator[str]:
    """A number unique to this test, to put in commands (`sleep 1000.123456`); after the
    test, no process whose command line holds it may be left on the host."""
    token = f"1000.{uuid.uuid4().int % 10**9:09d}"
    yield token
    left = wait_gone(token)
    for pid, _ in left:  # do not leak into the next test, but still fail this one
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="session")
def image_root() -> str:
    """The base image's root file system exported for bwrap's `root` (once; cached by image
    id under ~/.cache/metrale/rootfs), as terminal_bench exports a task image's."""
    import asyncio

    from metrale.benchmarks.terminal_bench.images import TaskImage, export_rootfs, inspect
    from metrale.runtime.configs import DEFAULT_IMAGE
    from tests.runtime.engine import require_engine

    require_engine()

    async def export() -> str:
        info = await inspect("docker", DEFAULT_IMAGE)
        assert info is not None
        image = TaskImage(
            tag=DEFAULT_IMAGE,
            image_id=str(info["Id"]).removeprefix("sha256:"),
            cached=True,
            build_s=0.0,
            workdir=None,
        )
        return str(await export_rootfs(image, "docker"))

    return asyncio.run(export())


@pytest.fixture(params=["host", "image-root"])
def bwrap_root(request: pytest.FixtureRequest) -> dict[str, str]:
    """bwrap options for the two ways a sandbox sees a system: the host's directories, or an
    exported image's root (terminal_bench's tasks): every hardening test runs under both."""
    if request.param == "host":
        return {}
    return {"root": request.getfixturevalue("image_root")}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A one-node Ray head on loopback in its own temp dir, stopped by its own pids (once per
    module that uses it: test_conformance's ray cells, test_ray_start)."""
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
        # only this cluster's processes: every one inherits the marker in its environment
        kill_tree([], marker=f"METRALE_TEST_RAY={temp}".encode())
        shutil.rmtree(temp, ignore_errors=True)


def in_bwrap(body: Callable[[Runtime], Awaitable[Any]], **options: Any) -> Any:
    """`body(rt)` in a started bwrap sandbox with `options`, stopped after."""

    async def main() -> Any:
        async with create_runtime(runtime_config("bwrap", **options)) as rt:
            return await body(rt)

    return asyncio.run(main())
