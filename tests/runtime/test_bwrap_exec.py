"""The bwrap sandbox's executor (`bwrap_exec`): commands forked inside by the sandbox's own
command. What the route must keep of a command entered from the host: its arguments and
environment exactly, nothing of metrale's or of another command's, its own exit status, its
timeout and kill, several at once, and a sandbox whose process count does not grow."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

import pytest

from metrale.runtime import Runtime, bwrap_runtime, bwrap_setup, create_runtime, runtime_config
from metrale.runtime.base import RuntimeStartError, SandboxLostError
from metrale.runtime.bwrap import BwrapRuntime
from metrale.runtime.bwrap_exec import CONTROL, command_script
from metrale.runtime.bwrap_setup import CONTROL_ROOT, WORKDIR_PREFIX, leftover_workdirs
from metrale.runtime.bwrap_watchdog import owner_prefix
from tests.runtime.conftest import HAVE_BWRAP, in_bwrap, processes_with

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")


def test_arguments_and_environment_arrive_verbatim() -> None:
    odd = ["a b", "new\nline", "'single'", '"double"', "$HOME", "`id`", "\\n", "-", "", "*"]
    env = {"QUOTED": 'it\'s "x" $PATH `id`\nsecond', "EMPTY": "", "dotted.name": "kept"}

    async def body(rt: Runtime) -> tuple[str, str]:
        args = await rt.run(["printf", "%s\\0", *odd])
        seen = await rt.run(["env"], env=env)
        return args.stdout, seen.stdout

    args, seen = in_bwrap(body)
    assert args.split("\0")[:-1] == odd
    # a name no shell can export still arrives (`env -i` sets the environment then)
    assert {'QUOTED=it\'s "x" $PATH `id`', "second", "EMPTY=", "dotted.name=kept"} <= set(
        seen.splitlines()
    )


def test_the_executor_reads_a_long_command_in_blocks_not_a_byte_at_a_time() -> None:
    """A shell's `read` takes a byte a system call; the executor reads its scripts as its
    own input, a block at a time (`/proc/PID/io`'s `syscr` counts its reads)."""
    word = "x" * 100_000

    def reads(rt: BwrapRuntime) -> int:
        assert rt._sandbox is not None
        (executor,) = rt._sandbox.keep
        io = Path(f"/proc/{executor}/io").read_text()
        return int(next(line for line in io.splitlines() if line.startswith("syscr:")).split()[1])

    async def body(rt: Runtime) -> tuple[int, str]:
        assert isinstance(rt, BwrapRuntime)
        before = reads(rt)
        result = await rt.run(["sh", "-c", 'printf %s "$0" "$1" | wc -c', word, f"\n{word}"])
        return reads(rt) - before, result.stdout

    count, out = in_bwrap(body)
    assert out.strip() == str(2 * len(word) + 1)
    assert count < 100, f"{count} reads for a 200 KB script"


def test_a_null_byte_is_refused_as_by_exec() -> None:
    with pytest.raises(ValueError, match="null byte"):
        command_script(1, ["echo", "a\0b"], {}, None, None, stdin=False)


def test_a_command_holds_only_its_own_three_fds_and_cannot_touch_the_control_dir() -> None:
    async def body(rt: Runtime) -> tuple[str, str, str]:
        fds = await rt.run("for f in /proc/self/fd/*; do echo ${f##*/}; done")
        listed = await rt.run(f"ls {CONTROL} 2>&1; touch {CONTROL}/x 2>&1; echo end")
        w = await rt.run("ls -l /proc/$PPID/fd | grep -c pipe; echo $?")
        return fds.stdout, listed.stdout, w.stdout

    fds, listed, _ = in_bwrap(body)
    # 0, 1, 2, and the directory the shell's glob holds open while it lists
    assert sorted(fds.split())[:3] == ["0", "1", "2"] and len(fds.split()) <= 4
    assert "Permission denied" in listed and "Read-only file system" in listed


def test_several_commands_at_once_each_get_their_own_output_and_status() -> None:
    async def body(rt: Runtime) -> list[tuple[int, str, str]]:
        results = await asyncio.gather(
            *(
                rt.run(f"sleep 0.{i % 3}; echo out-{i}; echo err-{i} >&2; exit {i}")
                for i in range(12)
            )
        )
        return [(r.exit_code, r.stdout, r.stderr) for r in results]

    for i, (code, out, err) in enumerate(in_bwrap(body)):
        assert (code, out, err) == (i, f"out-{i}\n", f"err-{i}\n")


def test_stdin_larger_than_a_pipe_arrives_whole() -> None:
    payload = b"".join(b"line %07d\n" % i for i in range(80_000))  # 1 MiB

    async def body(rt: Runtime) -> bytes:
        await rt.write("/tmp/big.txt", payload)  # outside the workdir: through a command's stdin
        return await rt.read("/tmp/big.txt")

    assert in_bwrap(body) == payload


def test_a_killed_command_is_reported_killed_and_the_sandbox_goes_on(marker: str) -> None:
    async def body(rt: Runtime) -> tuple[int, int, str]:
        # the command's subshell kills the process that would answer for it
        killed = await rt.run("kill -9 $PPID", timeout=30)
        hung = asyncio.ensure_future(rt.run(f"sleep {marker}; echo never"))
        await asyncio.sleep(0.5)
        await rt.kill_commands()  # a command in flight ends with it, without its timeout
        cut = await asyncio.wait_for(hung, 10)
        after = await rt.run("echo still here")
        return killed.exit_code, cut.exit_code, after.stdout

    assert in_bwrap(body) == (137, 137, "still here\n")


def test_a_command_that_signals_its_process_group_ends_itself_not_the_sandbox() -> None:
    """Without job control every process of the sandbox shares one process group, so a
    command's `kill 0` (SIGTERM, as `trap 'kill 0' EXIT` sends at a script's end) reaches the
    executor and W too: they ignore it, the command gets it at its default."""

    async def body(rt: Runtime) -> list[tuple[int, str]]:
        done = []
        for command in ("sleep 30 & kill 0; echo not reached",
                        "trap 'kill 0' EXIT; sleep 30 & echo started",
                        "kill -USR1 0",
                        "echo still here; grep SigIgn /proc/self/status"):  # fmt: skip
            result = await rt.run(command, timeout=20)
            done.append((result.exit_code, result.stdout))
        return done

    term, trapped, usr1, after = in_bwrap(body)
    assert term == (143, "") and trapped == (143, "started\n") and usr1[0] == 138
    lines = after[1].splitlines()
    assert after[0] == 0 and lines[0] == "still here"
    ignored = int(lines[1].split()[1], 16)
    for sig in (1, 10, 12, 14, 15):  # HUP, USR1, USR2, ALRM, TERM: the command's own again
        assert not ignored & 1 << (sig - 1), sig


def test_a_command_that_exits_137_itself_is_answered_at_once() -> None:
    async def body(rt: Runtime) -> tuple[int, float]:
        started = time.perf_counter()
        result = await rt.run("exit 137")
        return result.exit_code, time.perf_counter() - started

    code, took = in_bwrap(body)
    # its W answered: no wait to tell a lost sandbox from a killed command
    assert code == 137 and took < 0.9


def test_a_timeout_kills_the_commands_whole_tree_and_nothing_else(marker: str) -> None:
    async def body(rt: Runtime) -> tuple[bool, int, int]:
        kept, child, grandchild = (f"{marker}{i}" for i in range(1, 4))  # sleep's seconds
        server = await rt.run(f"(sleep {kept} &) ; echo started")
        assert server.stdout == "started\n"
        result = await rt.run(f"sleep {child} & sh -c 'sleep {grandchild}'", timeout=1)
        deadline = time.monotonic() + 5
        while processes_with(child) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tree = len(processes_with(child)) + len(processes_with(grandchild))
        return result.timed_out, tree, len(processes_with(kept))

    # the earlier command's daemon (reparented to PID 1) is not this command's to kill
    assert in_bwrap(body) == (True, 0, 1)


def test_many_commands_leave_no_process_behind_within_a_small_process_limit() -> None:
    async def body(rt: Runtime) -> tuple[list[int], int]:
        codes = [(await rt.run(["true"])).exit_code for _ in range(150)]
        count = await rt.run("ls -d /proc/[0-9]* | wc -l")
        return codes, int(count.stdout)

    codes, count = in_bwrap(body, max_procs=16)
    assert codes == [0] * 150
    # PID 1, the executor, at most a few answered commands not yet reaped, and the count's own
    assert count <= 8


EXECUTOR_KILL = "kill -9 $(cat /proc/1/task/1/children)"  # PID 1's one child: the executor


def test_a_sandbox_whose_executor_dies_under_a_command_is_lost() -> None:
    async def body(rt: Runtime) -> None:
        assert isinstance(rt, BwrapRuntime)
        started = time.perf_counter()
        with pytest.raises(SandboxLostError):
            await rt.run(f"{EXECUTOR_KILL}; sleep 30")
        assert time.perf_counter() - started < 15
        with pytest.raises(SandboxLostError):
            await rt.run("echo after")

    in_bwrap(body)


def test_a_command_that_kills_the_executor_and_exits_leaves_the_sandbox_lost() -> None:
    """Its own status may come back before the executor has died (SIGKILL is delivered when
    the executor next runs, and W answers as soon as `kill` returns, more often on a loaded
    machine); the sandbox is lost for every command after it either way."""

    async def body(rt: Runtime) -> None:
        assert isinstance(rt, BwrapRuntime)
        with contextlib.suppress(SandboxLostError):
            assert (await rt.run(EXECUTOR_KILL)).exit_code == 0
        with pytest.raises(SandboxLostError):
            await rt.run("echo after")

    in_bwrap(body)


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_control_dir_planted_in_advance_fails_the_start_and_is_left_alone(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev/shm is shared: whatever another user put where a sandbox's control directory goes
    (a directory of theirs, or a link to one) makes the start fail, and metrale neither
    changes it nor removes what is in it."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "keep.txt").write_text("mine")
    planted = theirs if kind == "directory" else tmp_path / "planted"
    if kind == "symlink":
        planted.symlink_to(theirs)
    monkeypatch.setattr(bwrap_runtime, "control_dir", lambda _workdir: planted)
    before = _own_dirs()

    async def main() -> None:
        with pytest.raises(RuntimeStartError, match="cannot prepare"):
            async with create_runtime(runtime_config("bwrap")):
                pass

    asyncio.run(main())
    assert (theirs / "keep.txt").read_text() == "mine"
    assert theirs.stat().st_mode & 0o777 == 0o755
    assert _own_dirs() == before


def _own_dirs() -> set[str]:
    """This process's sandbox directories (other test workers' run beside it), but the
    `/etc` copy it keeps for its life."""
    own = owner_prefix(WORKDIR_PREFIX)
    return {p.name for p in leftover_workdirs() if p.name.startswith(own) and "-etc-" not in p.name}


def test_sandboxes_run_with_their_temp_dirs_on_the_control_dirs_tmpfs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`TMPDIR=/dev/shm` puts a sandbox's temp dir where its control directory goes: the two
    must not be one path (the start failed with EEXIST)."""
    if not Path(CONTROL_ROOT).is_dir():
        pytest.skip(f"{CONTROL_ROOT}: no such directory here")
    monkeypatch.setattr(tempfile, "tempdir", CONTROL_ROOT)
    before = _own_dirs()

    async def body(rt: Runtime) -> str:
        assert isinstance(rt, BwrapRuntime) and rt.workdir is not None
        assert rt.workdir.parent == Path(CONTROL_ROOT)
        await rt.write("note.txt", "there\n")
        return (await rt.run(["cat", "note.txt"])).stdout

    assert in_bwrap(body) == "there\n"
    assert _own_dirs() == before


@pytest.mark.parametrize("control_root", [CONTROL_ROOT, "/nonexistent-metrale-control"])
def test_the_control_and_staging_dirs_are_out_of_the_sandboxs_reach(
    control_root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The workdir is the sandbox's own (its host uid owns it, `/work` binds it writable), so
    the control directory (FIFOs) and root's staging paths go beside it, never in it: on the
    tmpfs where there is one, else next to the workdir. The sandbox sees an empty `/work`
    and nothing of either; all three are gone after the stop."""
    monkeypatch.setattr(bwrap_setup, "CONTROL_ROOT", control_root)
    shared = tmp_path / "shared"
    shared.mkdir()
    before = _own_dirs()
    tmpfs = Path(control_root).is_dir()

    async def body(rt: Runtime) -> tuple[str, list[Path]]:
        assert isinstance(rt, BwrapRuntime) and rt.workdir is not None and rt.control
        where = Path(control_root) if tmpfs else rt.workdir.parent
        assert rt.control.parent == where and rt.control.name == rt.workdir.name + ".ctl"
        made = [rt.workdir, rt.control, bwrap_setup.stage_dir(rt.workdir)]
        listed = await rt.run("ls -A /work; ls -A /work/shared; echo end")
        return listed.stdout, made

    listed, made = in_bwrap(body, rw_binds=[f"{shared}:/work/shared"])
    assert listed == "shared\nend\n"
    assert not any(p.exists() for p in made) and _own_dirs() == before


def test_bwraps_status_line_is_read_at_once_when_there_and_awaited_when_not() -> None:
    """By the executor's answer bwrap has written its status line: one `read`. Should it
    come later (in pieces, or not at all before bwrap exits), the start waits for it."""

    async def line(*pieces: bytes) -> bytes:
        r, w = os.pipe()
        loop = asyncio.get_running_loop()
        if pieces:
            os.write(w, pieces[0])
        for i, piece in enumerate(pieces[1:]):
            loop.call_later(0.02 * (i + 1), os.write, w, piece)
        loop.call_later(0.02 * len(pieces), os.close, w)  # bwrap exits
        try:
            return await bwrap_runtime._status_line(r)
        finally:
            os.close(r)

    async def main() -> list[bytes]:
        return [
            await line(b'{"child-pid": 7}\n'),
            await line(b"", b'{"child-pid": 8}\n'),
            await line(b'{"child-pi', b'd": 9}\n'),
            await line(),
        ]

    assert asyncio.run(main()) == [
        b'{"child-pid": 7}\n',
        b'{"child-pid": 8}\n',
        b'{"child-pid": 9}\n',
        b"",
    ]
