"""Host process plumbing shared by the runtimes: spawning with capped output, the environment
a command may inherit, resource-limit wrappers, killing process trees, rate limiting.

Output is streamed, never buffered whole: a command that prints 1 GB keeps its first and last
`cap / 2` bytes and counts the rest as dropped. A command's exit does not wait for its pipes to
close, since a background child (`server &`) may hold them for the sandbox's lifetime.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import BaseModel, Field

from metrale.bounds import CPU_S, FILE_SIZE_MB, MAX_PROCS, MEMORY_MB, pydantic_range
from metrale.runtime.base import ProgramResult
from metrale.runtime.spawn import DEVNULL, PIPE, spawn

T = TypeVar("T")

#: The only variables of metrale's environment a host command inherits (the subprocess runtime):
#: where programs are, language and terminal settings, who the user is. Anything else (API keys,
#: `DATABASE_URL`, `GH_PAT`, `AWS_*`, `SSH_AUTH_SOCK`, ...) reaches a sandbox only when passed
#: explicitly (`--env NAME` / `--env NAME=VALUE`, the config's `env`). An allow-list, since no
#: list of secret-looking names is ever complete.
HOST_ENV_ALLOW = (
    "PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME",
    "TERM", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL",
)  # fmt: skip

#: Where metrale looks up the host tools it runs itself (`sh`, `prlimit`, `setpriv`,
#: `bwrap`, ...): system directories only, never a PATH that an image, a task or a command's
#: environment could have set.
TRUSTED_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: The whole environment of every host-side helper a sandboxing runtime runs as root before its
#: sandbox boundary: nothing of metrale's, an image's or a command's (an `LD_PRELOAD`,
#: `LD_DEBUG_OUTPUT` or `PATH` there would act on a root process on the host).
HELPER_ENV = {"PATH": TRUSTED_PATH}

#: After a command exits, how long its output pipes may stay open before we stop reading:
#: a background child that inherited them must not hold `run()` hostage.
PIPE_GRACE_S = 0.1


@functools.cache
def host_tool(name: str) -> str:
    """The absolute path of host tool `name` in `TRUSTED_PATH`, looked up once per process
    (`name` itself when absent there: running it then fails, and `check()` says why)."""
    return shutil.which(name, path=TRUSTED_PATH) or name


def allowed_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` a sandboxed command may inherit: the names in `HOST_ENV_ALLOW`."""
    return {k: env[k] for k in HOST_ENV_ALLOW if k in env}


class Limits(BaseModel):
    """Per-process resource limits (setrlimit via `prlimit`); None leaves a limit as inherited.

    `memory_mb` bounds address space per process (RLIMIT_AS) where no memory cgroup bounds
    the sandbox's total (bwrap puts it there when the host has one), `max_procs` the processes
    of the sandbox's user (RLIMIT_NPROC; not enforced for uid 0 in the host's user namespace,
    so it binds in bwrap, whose sandboxes run as their own unprivileged host uid, but not for
    subprocess as root).
    """

    cpu_s: int | None = Field(default=1800, **pydantic_range(CPU_S))
    memory_mb: int | None = Field(default=8192, **pydantic_range(MEMORY_MB))
    max_procs: int | None = Field(default=256, **pydantic_range(MAX_PROCS))
    file_size_mb: int | None = Field(default=1024, **pydantic_range(FILE_SIZE_MB))

    def prlimit_argv(self, *, address_space: bool = True) -> list[str]:
        """`prlimit --cpu=.. --as=.. -- ` (empty when no limit is set); without
        `address_space` the memory bound is left to a cgroup."""
        args = []
        if self.cpu_s is not None:
            args.append(f"--cpu={self.cpu_s}")
        if self.memory_mb is not None and address_space:
            args.append(f"--as={self.memory_mb << 20}")
        if self.max_procs is not None:
            args.append(f"--nproc={self.max_procs}")
        if self.file_size_mb is not None:
            args.append(f"--fsize={self.file_size_mb << 20}")
        return [host_tool("prlimit"), *args, "--"] if args else []


class CappedBuffer:
    """Keeps the first `cap - cap // 2` and the last `cap // 2` bytes of a stream."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap - cap // 2
        self.tail_cap = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_cap:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - min(len(self.tail), self.tail_cap)

    def data(self) -> bytes:
        """What was kept, as bytes: the whole stream when nothing was dropped."""
        return bytes(self.head) + self._tail()

    def text(self) -> str:
        if self.dropped:
            marker = f"\n[... {self.dropped} bytes dropped ...]\n".encode()
            return (bytes(self.head) + marker + self._tail()).decode("utf-8", "replace")
        return self.data().decode("utf-8", "replace")

    def _tail(self) -> bytes:
        return bytes(self.tail[-self.tail_cap :]) if self.tail_cap else b""


class Capture(asyncio.Protocol):
    """Collects one pipe of a child into a capped buffer; `closed` completes at its EOF."""

    def __init__(self, buffer: CappedBuffer) -> None:
        self.buffer = buffer
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buffer.add(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _returning(protocol: Capture) -> Callable[[], Capture]:
    return lambda: protocol


def killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def spawned(
    make: Awaitable[T], pgid: Callable[[T], int], on_cancel: Callable[[T], None]
) -> T:
    """Await the making of a subprocess (`create_subprocess_exec`, `loop.subprocess_exec`) to
    its end even when cancelled meanwhile; then, if it was, kill its process group, hand it to
    `on_cancel` (so that the caller's teardown knows it) and raise the cancellation.

    asyncio's own cleanup of a transport cancelled half-made (close it, then wait for the
    child's exit) waited forever in about 1 of 10 runs interrupted during 64 bwrap starts: the
    exit never reached the transport. Never cancelling the making avoids that path."""
    task = asyncio.ensure_future(make)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    made = task.result()  # an OSError of the making is the caller's
    if cancelled:
        killpg(pgid(made))
        on_cancel(made)
        raise asyncio.CancelledError
    return made


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    timeout: float | None,
    cap: int,
    stdin: bytes | None = None,
    sessions: set[int] | None = None,
    pass_fds: Sequence[int] = (),
) -> ProgramResult:
    """Run `argv` in its own session; on timeout or cancellation kill its whole process group.

    The pid (= session id = pgid) is added to `sessions` while it may have members, so a
    runtime's `stop()` can kill what is left of it. Exit code 124 means timed out.
    """
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    child = await spawned(
        spawn(
            argv, env=env, cwd=cwd, stdin=PIPE if stdin is not None else DEVNULL,
            pass_fds=pass_fds,
        ),
        lambda made: made.pid,
        lambda made: made.close_pipes(),
    )  # fmt: skip
    pid = child.pid
    if sessions is not None:
        sessions.add(pid)
    out, err = CappedBuffer(cap), CappedBuffer(cap)
    transports: list[asyncio.BaseTransport] = []
    timed_out = False
    try:
        captures = []
        for pipe, buffer in ((child.stdout, out), (child.stderr, err)):
            capture = Capture(buffer)
            reading, _ = await loop.connect_read_pipe(_returning(capture), pipe)
            transports.append(reading)
            captures.append(capture.closed)
        if stdin is not None and child.stdin is not None:
            writing, _ = await loop.connect_write_pipe(asyncio.Protocol, child.stdin)
            transports.append(writing)
            with contextlib.suppress(OSError):
                writing.write(stdin)
                writing.write_eof()
        try:
            await asyncio.wait_for(child.wait(), timeout)
        except TimeoutError:
            timed_out = True
            killpg(pid)
            await child.wait()
        # background children may still hold the pipes: take what is there, then let go
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*captures)), PIPE_GRACE_S)
    except BaseException:
        killpg(pid)
        raise
    finally:
        for transport in transports:
            transport.close()
        child.close_pipes()
    code = child.returncode
    return captured(code if code is not None else -1, out, err, timed_out, started)


def captured(
    code: int, out: CappedBuffer, err: CappedBuffer, timed_out: bool, started: float
) -> ProgramResult:
    """The result of a command whose output `out` and `err` hold, begun at `started`
    (`time.perf_counter()`); a timed-out one's code is 124."""
    return ProgramResult(
        exit_code=124 if timed_out else code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        duration_s=time.perf_counter() - started,
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
    )


def _stat_fields(pid: str) -> tuple[str, int, int] | None:
    """(state, pgrp, session) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[3])


def _has_marker(pid: str, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def kill_tree(sessions: Iterable[int], marker: bytes | None = None, rounds: int = 200) -> int:
    """SIGKILL every live process whose session or group is in `sessions` or whose environment
    holds `marker`, until a scan finds none: this catches `setsid cmd &` escapees, which leave
    the group but keep the environment. Blocking (it scans /proc); call it in a thread.
    Returns how many processes were signalled."""
    wanted = set(sessions)
    me = os.getpid()
    killed = 0
    for _ in range(rounds):
        found = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            stat = _stat_fields(pid)
            if stat is None or stat[0] in ("Z", "X"):
                continue
            # a live pgrp/session id is never recycled, but a dead leader's pid may be: a
            # process that leads a group we know is ours only if it carries the marker
            n = int(pid)
            hit = (stat[1] in wanted and stat[1] != n) or (stat[2] in wanted and stat[2] != n)
            if not hit and marker is not None:
                hit = _has_marker(pid, marker)
            if hit:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
                    found += 1
        if not found:
            return killed
        killed += found
        time.sleep(0.005)
    return killed


class RateLimiter:
    """At most `rate` acquisitions per second, spaced evenly (a sandbox-creation throttle).

    Shared by every runtime that one `runtime_factory` makes; the wait counts as setup.
    """

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            now = time.monotonic()
            wait = self._next - now
            self._next = max(now, self._next) + self.interval
        if wait > 0:
            await asyncio.sleep(wait)


class _Watchdogs:
    """The watchdog processes this process started, by key: each must outlive every runtime
    and exist once whatever number of sandboxes run, so they are process-wide by nature."""

    started: ClassVar[dict[tuple[object, ...], subprocess.Popen[bytes]]] = {}


#: What a watchdog reads on its stdin once its owner is gone when the owner exited normally
#: (every sandbox stopped by then): it sweeps once and exits, instead of staying for the later
#: sweeps a SIGKILL needs (a start in flight at the kill). After a SIGKILL it reads EOF.
CLEAN_EXIT = b"clean\n"


def ensure_watchdog(key: tuple[object, ...], program: str, args: Sequence[str],
                    env: Mapping[str, str]) -> None:  # fmt: skip
    """Start `python -c program ARGS` once per (this process, `key`): a process that waits for
    this one to die, then removes what it left. Its own session, so that a Ctrl-C of metrale's
    process group does not take it down first. Its stdin is a pipe that gets `CLEAN_EXIT` at
    this process's normal exit."""
    full = (os.getpid(), *key)
    if full in _Watchdogs.started:
        return
    if not any(k[0] == os.getpid() for k in _Watchdogs.started):
        atexit.register(_exit_cleanly)
    _Watchdogs.started[full] = subprocess.Popen(
        [sys.executable, "-c", program, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(env),
        cwd="/",
    )


def _exit_cleanly() -> None:
    """At a normal exit: tell this process's watchdogs (see `CLEAN_EXIT`)."""
    for key, watchdog in _Watchdogs.started.items():
        if key[0] == os.getpid() and watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                watchdog.stdin.write(CLEAN_EXIT)
                watchdog.stdin.close()
