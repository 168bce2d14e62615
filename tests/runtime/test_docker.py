"""The docker runtime: argv checks always; the real thing only where `docker info` answers."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from metrale.runtime import DockerConfig, create_runtime, runtime_config
from metrale.runtime.docker import LABEL, DockerRuntime


def engine_reason() -> str | None:
    """Why there is no engine to test against, or None when `docker info` answers."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        probe = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "'docker info' did not answer in 20 s"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["failed"])[-1]
        return f"'docker info' failed: {last}"
    return None


NO_ENGINE = engine_reason()
needs_engine = pytest.mark.skipif(NO_ENGINE is not None, reason=f"no docker engine: {NO_ENGINE}")


def test_run_argv_labels_limits_and_isolates() -> None:
    rt = create_runtime(runtime_config("docker", image="img:1", cli="podman", max_procs=9))
    assert isinstance(rt, DockerRuntime)
    argv = rt.run_argv()
    assert argv[:3] == ["podman", "run", "-d"]
    assert f"{LABEL}=1" in argv and "img:1" in argv
    assert argv[argv.index("--network") + 1] == "none"
    assert argv[argv.index("--pids-limit") + 1] == "9"
    assert "--memory" in argv and "--cpus" in argv and "--init" in argv


@needs_engine
def test_container_runs_commands_and_is_removed_on_stop(marker: str) -> None:
    async def main() -> str:
        async with create_runtime(DockerConfig()) as rt:
            assert isinstance(rt, DockerRuntime)
            await rt.write("q.txt", marker)
            result = await rt.run("cat q.txt")
            assert result.stdout == marker
            slow = await rt.run("sleep 30", timeout=1)
            assert slow.timed_out and slow.exit_code == 124
            net = await rt.run(
                "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\""
            )
            assert net.exit_code != 0
            return rt.name

    name = asyncio.run(main())
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name={name}"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
