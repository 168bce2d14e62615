"""The spawner: host processes made off the event loop's thread, on threads that live on, each
child watched and reaped from the loop; the gate that lets the spawner set a child's cgroups
and limits before it runs anything."""

from __future__ import annotations

import asyncio
import os
import resource
import threading
from typing import Any

import pytest

from metrale.runtime import spawn as spawn_module
from metrale.runtime.bwrap_setup import GATE, GO
from metrale.runtime.procs import run_process
from metrale.runtime.spawn import DEVNULL, PIPE, read_line, spawn

ENV = {"PATH": "/usr/bin:/bin"}
#: a shell that waits at the gate, then runs the rest with /dev/null as its stdin
GATED = ["sh", "-c", f"{GATE} </dev/null", "sh"]


def test_spawns_are_made_off_the_loops_thread_by_threads_that_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spawn holds its thread until the child has exec'd: not the loop's. And the thread
    that made a child lives on (a parent-death signal fires when that *thread* exits)."""
    makers: list[threading.Thread] = []
    real = spawn_module.subprocess.Popen

    def popen(*args: Any, **kw: Any) -> Any:
        makers.append(threading.current_thread())
        return real(*args, **kw)

    monkeypatch.setattr(spawn_module.subprocess, "Popen", popen)

    async def main() -> list[int]:
        children = [await spawn(["true"], env=ENV, cwd=None, stdin=DEVNULL) for _ in range(8)]
        codes = [await child.wait() for child in children]
        for child in children:
            child.close_pipes()
        return codes

    assert asyncio.run(main()) == [0] * 8
    assert makers and all(t is not threading.main_thread() for t in makers)
    assert all(t.is_alive() for t in makers)


def test_a_child_is_reaped_with_its_exit_code_and_its_output_read() -> None:
    async def main() -> tuple[int, int | None, bytes]:
        child = await spawn(["sh", "-c", "echo hi; exit 3"], env=ENV, cwd=None, stdin=DEVNULL)
        assert child.stdout is not None
        line = await read_line(child.stdout, 10)
        code = await child.wait()
        child.close_pipes()
        return code, child.returncode, line

    code, returncode, line = asyncio.run(main())
    assert (code, returncode, line) == (3, 3, b"hi\n")


def test_the_gate_holds_the_child_until_its_limits_are_set() -> None:
    """`before_go` runs while the gate shell waits: what it runs next is already bound."""

    def limit(pid: int) -> None:
        resource.prlimit(pid, resource.RLIMIT_CPU, (7, 7))

    async def main() -> str:
        result = await run_process(
            [*GATED, "sh", "-c", "ulimit -t; ulimit -H -t; cat; echo end"],
            env=ENV, cwd=None, timeout=30, cap=4096,
            before_go=limit, go=GO,
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        return result.stdout

    # the limits set from outside, and stdin after the gate is /dev/null (EOF at once)
    assert asyncio.run(main()).split() == ["7", "7", "end"]


def test_the_gate_passes_what_follows_go_on_stdin() -> None:
    async def main() -> str:
        result = await run_process(
            ["sh", "-c", GATE, "sh", "cat"], env=ENV, cwd=None, timeout=30, cap=4096,
            stdin=b"payload\n", go=GO,
        )  # fmt: skip
        return result.stdout

    assert asyncio.run(main()) == "payload\n"


def test_a_failing_before_go_kills_and_reaps_the_child_and_raises() -> None:
    pids: list[int] = []

    def refuse(pid: int) -> None:
        pids.append(pid)
        raise OSError(1, "no cgroup for you")

    async def main() -> None:
        await spawn([*GATED, "sleep", "60"], env=ENV, cwd=None, stdin=PIPE,
                    before_go=refuse, go=GO)  # fmt: skip

    with pytest.raises(OSError, match="no cgroup for you"):
        asyncio.run(main())
    assert pids
    assert not os.path.exists(f"/proc/{pids[0]}"), "the refused child was left (or a zombie)"
