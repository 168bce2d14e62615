"""Host process plumbing shared by the runtimes: spawning with capped output, scrubbing
secrets from an environment, resource-limit wrappers, killing process trees, rate limiting.

Output is streamed, never buffered whole: a command that prints 1 GB keeps its first and last
`cap / 2` bytes and counts the rest as dropped. A command's exit does not wait for its pipes to
close, since a background child (`server &`) may hold them for the sandbox's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from metrale.runtime.base import ProgramResult

#: Environment names that look like credentials; matched case-insensitively on the whole name.
SECRET_NAME = re.compile(
    r"(API_?KEY|_KEY$|^KEY$|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|_AUTH$|^AUTH_)", re.I
)

#: After a command exits, how long its output pipes may stay open before we stop reading:
#: a background child that inherited them must not hold `run()` hostage.
PIPE_GRACE_S = 0.1


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment minus anything whose name looks like a secret (`*_API_KEY`, `*_TOKEN`,
    `*_SECRET`, `*PASSWORD*`, ...): sandboxed commands must not see the host's credentials."""
    return {k: v for k, v in env.items() if not SECRET_NAME.search(k)}


class Limits(BaseModel):
    """Per-process resource limits (setrlimit via `prlimit`); None leaves a limit as inherited.

    `memory_mb` bounds address space (RLIMIT_AS), `max_procs` the processes of the sandbox's
    user (RLIMIT_NPROC; not enforced for uid 0 in the host's user namespace, so it binds in
    bwrap, which runs commands in their own user namespace, but not for subprocess as root).
    """

    cpu_s: int | None = 1800
    memory_mb: int | None = 8192
    max_procs: int | None = 256
    file_size_mb: int | None = 1024

    def prlimit_argv(self) -> list[str]:
        """`prlimit --cpu=.. --as=.. -- ` (empty when no limit is set)."""
        args = []
        if self.cpu_s is not None:
            args.append(f"--cpu={self.cpu_s}")
        if self.memory_mb is not None:
            args.append(f"--as={self.memory_mb << 20}")
        if self.max_procs is not None:
            args.append(f"--nproc={self.max_procs}")
        if self.file_size_mb is not None:
            args.append(f"--fsize={self.file_size_mb << 20}")
        return ["prlimit", *args, "--"] if args else []


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

    def text(self) -> str:
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail_cap else b""
        if self.dropped:
            marker = f"\n[... {self.dropped} bytes dropped ...]\n".encode()
            return (bytes(self.head) + marker + tail).decode("utf-8", "replace")
        return (bytes(self.head) + tail).decode("utf-8", "replace")


class _CappedProtocol(asyncio.SubprocessProtocol):
    """Collects stdout/stderr into capped buffers and reports the exit as soon as it happens
    (asyncio's `Process.wait()` also waits for the pipes, which a background child may hold)."""

    def __init__(self, cap: int) -> None:
        loop = asyncio.get_running_loop()
        self.out, self.err = CappedBuffer(cap), CappedBuffer(cap)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.out if fd == 1 else self.err).add(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    timeout: float | None,
    cap: int,
    stdin: bytes | None = None,
    sessions: set[int] | None = None,
) -> ProgramResult:
    """Run `argv` in its own session; on timeout or cancellation kill its whole process group.

    The pid (= session id = pgid) is added to `sessions` while it may have members, so a
    runtime's `stop()` can kill what is left of it. Exit code 124 means timed out.
    """
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _CappedProtocol(cap),
        *argv,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    pid = transport.get_pid()
    if sessions is not None:
        sessions.add(pid)
    if stdin is not None:
        pipe = transport.get_pipe_transport(0)
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.write(stdin)
                pipe.write_eof()
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(protocol.exited), timeout)
        except TimeoutError:
            timed_out = True
            killpg(pid)
            await protocol.exited
        # background children may still hold the pipes: take what is there, then let go
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(protocol.pipes_closed), PIPE_GRACE_S)
    except BaseException:
        killpg(pid)
        transport.close()
        raise
    code = transport.get_returncode()
    transport.close()
    return ProgramResult(
        exit_code=124 if timed_out else (code if code is not None else -1),
        stdout=protocol.out.text(),
        stderr=protocol.err.text(),
        timed_out=timed_out,
        duration_s=time.perf_counter() - started,
        stdout_dropped=protocol.out.dropped,
        stderr_dropped=protocol.err.dropped,
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


def _own_cgroup(controller: str) -> Path | None:
    """Where this process sits in the hierarchy that has `controller` (v1), or in the
    unified hierarchy (v2) when `controller` is delegated there; None otherwise."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            base = Path("/sys/fs/cgroup") / controller
            return base / path.lstrip("/")
    for line in lines:
        hier, controllers, path = line.split(":", 2)
        if hier == "0" and controllers == "":
            here = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                enabled = (here / "cgroup.subtree_control").read_text().split()
            except OSError:
                return None
            return here if controller in enabled else None
    return None


class PidsCgroup:
    """A `pids` cgroup holding one sandbox, so its process limit counts only its own processes
    whoever they run as (RLIMIT_NPROC counts per host user and exempts root). Created only where
    the host lets us; `create()` returns None elsewhere and the caller relies on RLIMIT_NPROC."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, max_pids: int) -> PidsCgroup | None:
        parent = _own_cgroup("pids")
        if parent is None or not os.access(parent, os.W_OK):
            return None
        path = parent / name
        try:
            path.mkdir()
        except OSError:
            return None
        try:
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv`, moved into this cgroup before it starts (so all its children are in it)."""
        procs = str(self.path / "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def remove(self) -> None:
        """Blocking: waits briefly for killed processes to leave, then removes the cgroup."""
        for _ in range(200):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                with contextlib.suppress(OSError):
                    for pid in (self.path / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.01)
