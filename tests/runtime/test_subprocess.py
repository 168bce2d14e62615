"""What is particular to the subprocess runtime: a host workdir that stop() removes, the
marker that finds `setsid` escapees, and a process limit only where RLIMIT_NPROC binds."""

from __future__ import annotations

import asyncio
import os

import pytest

from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.subprocess import MARKER_VAR, SubprocessRuntime
from tests.runtime.conftest import processes_with


def test_workdir_is_fresh_and_removed_on_stop(marker: str) -> None:
    async def main() -> None:
        a = create_runtime(runtime_config("subprocess"))
        b = create_runtime(runtime_config("subprocess"))
        assert isinstance(a, SubprocessRuntime) and isinstance(b, SubprocessRuntime)
        async with a, b:
            assert a.workdir != b.workdir
            result = await a.run(f"pwd; echo ${MARKER_VAR}; echo $HOME")
            assert result.stdout.split() == [str(a.workdir), a.id, str(a.workdir)]
        assert a.workdir is not None and not a.workdir.exists()

    asyncio.run(main())


def test_an_escapee_that_leaves_the_session_is_still_killed(marker: str) -> None:
    async def main() -> None:
        async with create_runtime(runtime_config("subprocess")) as rt:
            # a daemon that double-forks into a new session and closes its stdio
            await rt.run(f"(setsid setsid sleep {marker} < /dev/null > /dev/null 2>&1 &)")
            await asyncio.sleep(0.2)
            assert processes_with(marker)
        assert not processes_with(marker)

    asyncio.run(main())


@pytest.mark.skipif(
    os.geteuid() == 0, reason="RLIMIT_NPROC does not bind uid 0; use bwrap for a process limit"
)
def test_fork_bomb_is_stopped_by_the_process_limit(marker: str) -> None:
    mine = sum(1 for p in os.listdir("/proc") if p.isdigit() and _owned(p))

    async def main() -> None:
        # bounded: at most 24 processes more than this user already has, 3 s at most
        async with create_runtime(runtime_config("subprocess", max_procs=mine + 24)) as rt:
            result = await rt.run(f"b() {{ b | b; }}; b # {marker}", timeout=3)
            assert "fork" in (result.stdout + result.stderr).lower()

    asyncio.run(main())


def _owned(pid: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False
