"""The spawner: host processes made off the event loop's thread, on threads that live on, each
child watched and reaped from the loop; `spawn_as`, which starts a child as another host uid
from a spawner thread that takes that uid for the spawn alone."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest

from metrale.runtime import spawn as spawn_module
from metrale.runtime.spawn import DEVNULL, read_line, spawn, spawn_as
from metrale.runtime.spawn_as import can_spawn_as

ENV = {"PATH": "/usr/bin:/bin"}


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


ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="changing a child's ids needs root")
HERE = pytest.mark.skipif(not can_spawn_as(), reason="spawn_as: not on this machine")
#: a uid and gid that no account and no other test uses
IDS = (1_799_999_123, 1_799_999_321)
#: what a child says of itself: its ids, groups, capabilities, ignored signals, session, fds
SELF = (
    "grep -E '^(Uid|Gid|Groups|CapPrm|CapEff|SigIgn):' /proc/self/status; "
    "echo sid $(cut -d' ' -f6 /proc/self/stat) pid $$; ls /proc/self/fd"
)


def _status(text: str) -> dict[str, list[str]]:
    return {line.split()[0].rstrip(":"): line.split()[1:] for line in text.splitlines() if line}


async def _run_as(ids: tuple[int, int] | None, fds: dict[int, int] | None = None) -> str:
    child = await spawn_as(["/bin/sh", "-c", SELF], env=ENV, ids=ids, fds=fds)
    assert child.stdout is not None and child.stdin is not None
    child.stdin.close()
    assert await child.wait() == 0  # its few lines fit in the pipe
    out = child.stdout.read()
    child.close_pipes()
    return out.decode()


@ROOT
@HERE
def test_spawn_as_runs_the_child_as_the_ids_with_no_groups_and_no_capabilities() -> None:
    seen = _status(asyncio.run(_run_as(IDS)))
    uid, gid = (str(i) for i in IDS)
    assert seen["Uid"] == [uid] * 4 and seen["Gid"] == [gid] * 4  # real, effective, saved, fs
    assert seen["Groups"] == []
    assert int(seen["CapPrm"][0], 16) == 0 and int(seen["CapEff"][0], 16) == 0


@ROOT
@HERE
def test_spawn_as_gives_back_the_spawner_threads_ids() -> None:
    """The thread that took the ids for a spawn has its own back after it: what it spawns
    next, and what the other threads spawn meanwhile, run as metrale (root, its groups)."""

    async def main() -> list[dict[str, list[str]]]:
        runs = [_run_as(IDS if i % 2 else None) for i in range(16)]  # the spawners interleave
        return [_status(out) for out in await asyncio.gather(*runs)]

    seen = asyncio.run(main())
    groups = sorted(str(g) for g in os.getgroups())
    for i, child in enumerate(seen):
        if i % 2:
            assert child["Uid"] == [str(IDS[0])] * 4
        else:
            assert child["Uid"] == ["0"] * 4 and sorted(child["Groups"]) == groups
    after = _status(asyncio.run(_run_as(None)))
    assert after["Uid"] == ["0"] * 4 and sorted(after["Groups"]) == groups


@HERE
def test_spawn_as_gives_the_child_only_its_pipes_and_the_fds_named() -> None:
    """fd 3 is the one named (whatever its number here, even 3 itself); nothing else of
    metrale's is open in the child; the child leads its own session; SIGPIPE is not ignored."""
    read_end, write_end = os.pipe()
    spare = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(spare, True)  # as an fd metrale inherited would be: not passed either
    try:

        async def main() -> str:
            return await _run_as(None, {3: write_end, 7: write_end})

        out = asyncio.run(main())
    finally:
        for fd in (read_end, write_end, spare):
            os.close(fd)
    fds = [int(x) for x in out.split("\nsid ", 1)[1].splitlines()[1:]]  # `ls`'s lines
    assert sorted(fds) == [0, 1, 2, 3, 4, 7], out  # 4: the directory `ls` itself lists
    sid = out.split("sid ", 1)[1].split()
    assert sid[0] == sid[2], out  # session id = its pid
    ignored = int(_status(out)["SigIgn"][0], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), out  # Python ignores it; the child not


@HERE
def test_spawn_as_a_program_that_cannot_start_is_an_oserror() -> None:
    async def main() -> None:
        await spawn_as(["/nonexistent/program"], env=ENV, ids=None)

    with pytest.raises(OSError):
        asyncio.run(main())
