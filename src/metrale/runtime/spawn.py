"""Host processes made off the event loop's thread: one spawner thread per metrale process.

A spawn holds the thread that makes it until the child has `exec`ed its program (`vfork`), and
on this kind of 2-core machine under load that is most of a millisecond. With 512 sandboxes
started at once and a command in each, py-spy showed the event loop's thread busy 94% of the
run, a quarter of it inside `Popen._execute_child`: the loop, not the cores, set the pace. The
spawn releases the GIL while it waits, so a thread of its own makes it beside the loop, on the
other core.

A few threads that live as long as the process, not a pool that grows and shrinks: the
parent-death signal a sandbox arms (bwrap's `--die-with-parent`) fires when the *thread* that
forked it exits, so a worker thread that ended would take its sandboxes with it. They only
spawn; everything else about a child (its pipes, its exit, reaping it) happens on the loop,
through a pidfd taken right after the spawn, before anything could reap the child.

`spawn_as` starts a program as another host uid from a spawner thread (`spawn_as`'s module).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import select
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, ClassVar, Protocol

from metrale.runtime.spawn_as import start_as

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
#: Spawns in flight at once: each waits mostly for its child's first `exec`, so a few threads
#: overlap those waits (one thread was busy half of a 512-sandbox run, spawns queueing ~10 ms).
SPAWNER_THREADS = 4


class _Process(Protocol):
    """What `Child` needs of a started process (`subprocess.Popen` has it; so has `_Spawned`)."""

    pid: int
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | None

    def wait(self) -> int: ...


class _Spawned:
    """A child of `posix_spawn`, with the names of `Popen` that `Child` uses."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class Child:
    """A process made by `spawn` or `spawn_as`, watched on the loop that asked for it:
    `exited` completes once it has exited and been reaped (its `returncode` set)."""

    def __init__(self, popen: _Process, pidfd: int) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._pidfd = pidfd
        self._loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._reap)

    @property
    def stdin(self) -> IO[bytes] | None:
        return self._popen.stdin

    @property
    def stdout(self) -> IO[bytes] | None:
        return self._popen.stdout

    @property
    def stderr(self) -> IO[bytes] | None:
        return self._popen.stderr

    @property
    def returncode(self) -> int | None:
        """None until the child is reaped; reaping happens on the loop's thread only, so a
        process group killed from that thread while this is None cannot be a reused pid."""
        return self._popen.returncode

    def _reap(self) -> None:
        self._loop.remove_reader(self._pidfd)
        code = self._popen.wait()  # the pidfd is readable: it has exited, this does not block
        os.close(self._pidfd)
        self._pidfd = -1
        if not self.exited.done():
            self.exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    def exited_within(self, timeout_s: float) -> bool:
        """Blocking, on the loop's thread: whether the child has exited (reaped or not) within
        `timeout_s`. For a caller that killed it and must know it is gone before going on."""
        if self._pidfd < 0:
            return True
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))

    def close_pipes(self) -> None:
        """Close metrale's ends of the child's pipes (not the pidfd: `exited` still comes)."""
        for pipe in (self._popen.stdin, self._popen.stdout, self._popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class _Spawner:
    """The process's spawner threads and their one queue of spawns, made on first use (per
    pid: a forked child makes its own). Process-wide by nature, like the watchdogs."""

    started: ClassVar[dict[int, _Spawner]] = {}
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        for i in range(SPAWNER_THREADS):
            name = f"metrale-spawner-{i}"
            threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:  # never returns: see the module docstring
            self.jobs.get()()

    @classmethod
    def get(cls) -> _Spawner:
        with cls.lock:
            pid = os.getpid()
            if pid not in cls.started:
                cls.started[pid] = cls()
            return cls.started[pid]


async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    stdin: int,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Start `argv` in a session of its own (stdout and stderr piped) on a spawner thread.
    OSError when it cannot be started. Await it to its end even when cancelled (`spawned`):
    a child made after its caller left would have no one to stop it."""
    return await _on_spawner(lambda: _start(argv, env, cwd, stdin, pass_fds))


async def spawn_as(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    ids: tuple[int, int] | None,
    fds: Mapping[int, int] | None = None,
) -> Child:
    """Start `argv` (an absolute path first) in a session of its own, as host uid and gid
    `ids` with no supplementary groups and no capabilities (None: as metrale; `ids` needs
    root), with stdin, stdout and stderr piped, `fds` (child fd: metrale's fd) its only other
    open fds, and metrale's cwd; only where `can_spawn_as()`. OSError when it cannot be
    started; await it as `spawn`."""
    return await _on_spawner(lambda: _start_as(argv, env, ids, fds or {}))


async def _on_spawner(start: Callable[[], tuple[_Process, int]]) -> Child:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[_Process, int]] = loop.create_future()

    def deliver(result: tuple[_Process, int] | BaseException) -> None:
        if done.done():
            return
        if isinstance(result, BaseException):
            done.set_exception(result)
        else:
            done.set_result(result)

    def job() -> None:
        result: tuple[_Process, int] | BaseException
        try:
            result = start()
        except BaseException as exc:  # handed to the caller, whatever it is
            result = exc
        try:
            loop.call_soon_threadsafe(deliver, result)
        except RuntimeError:  # the loop closed meanwhile: nobody will stop it, so do it here
            if not isinstance(result, BaseException):
                _kill(result[0])

    _Spawner.get().jobs.put(job)
    process, pidfd = await done
    return Child(process, pidfd)


def _start(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    stdin: int,
    pass_fds: Sequence[int],
) -> tuple[_Process, int]:
    popen = subprocess.Popen(
        list(argv), stdin=stdin, stdout=PIPE, stderr=PIPE, env=dict(env), cwd=cwd,
        start_new_session=True, pass_fds=tuple(pass_fds),
    )  # fmt: skip
    try:
        pidfd = os.pidfd_open(popen.pid)
    except BaseException:
        _kill(popen)
        raise
    return popen, pidfd


def _start_as(
    argv: Sequence[str], env: Mapping[str, str], ids: tuple[int, int] | None, fds: Mapping[int, int]
) -> tuple[_Process, int]:
    pipes = [os.pipe() for _ in range(3)]
    ours = [pipes[0][1], pipes[1][0], pipes[2][0]]  # stdin's write end, the others' read ends
    theirs = {0: pipes[0][0], 1: pipes[1][1], 2: pipes[2][1], **fds}
    try:
        pid = start_as(argv, env, ids, theirs)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
    files = [os.fdopen(ours[0], "wb", 0), os.fdopen(ours[1], "rb", 0), os.fdopen(ours[2], "rb", 0)]
    child = _Spawned(pid, *files)
    try:
        pidfd = os.pidfd_open(pid)
    except BaseException:
        _kill(child)
        raise
    return child, pidfd


def _kill(popen: _Process) -> None:
    with contextlib.suppress(OSError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()


async def read_line(pipe: IO[bytes], timeout: float) -> bytes:
    """One line from `pipe` (what came before EOF, or b"" after `timeout`); `pipe` is closed
    after, whatever happens: it serves one answer."""
    return await _read(pipe, timeout, lambda reader: reader.readline())


async def read_some(pipe: IO[bytes], limit: int, timeout: float) -> bytes:
    """Up to `limit` bytes of `pipe` (b"" after `timeout`); `pipe` is closed after."""
    return await _read(pipe, timeout, lambda reader: reader.read(limit))


async def _read(
    pipe: IO[bytes], timeout: float, take: Callable[[asyncio.StreamReader], Awaitable[bytes]]
) -> bytes:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
    except BaseException:
        pipe.close()
        raise
    try:
        return await asyncio.wait_for(take(reader), timeout)
    except TimeoutError:
        return b""
    finally:
        transport.close()
