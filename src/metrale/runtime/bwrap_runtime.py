"""The bwrap sandbox's life: `start()` prepares its host side (`bwrap_layout`, in a worker
thread), launches bwrap and waits for the answer from inside; `stop()` kills it and removes
everything it made, whatever cancels it. Commands and files are `bwrap_commands`'s; what
holds, and how, is in `bwrap`'s docstring."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from metrale.runtime import bwrap_setup
from metrale.runtime.base import RuntimeStartError, Throttle
from metrale.runtime.bwrap_commands import BwrapCommands
from metrale.runtime.bwrap_etc import etc_view
from metrale.runtime.bwrap_exec import Executor, executor_preamble
from metrale.runtime.bwrap_layout import Layout, bwrap_argv, fill
from metrale.runtime.bwrap_setup import (
    HOST_UID_BASE,
    HOST_UID_RANGE,
    READY_TIMEOUT_S,
    SPAWN_ENV,
    STATUS_FD,
    WORKDIR_PREFIX,
    as_uid,
    control_dir,
    etc_root,
    privileged,
    sandbox_tmpdir,
    stage_argv,
    stage_dir,
)
from metrale.runtime.bwrap_watchdog import ensure_watchdog, owner_prefix
from metrale.runtime.cgroups import SandboxCgroup
from metrale.runtime.procs import killpg, spawned
from metrale.runtime.sandbox_proc import SandboxProcess
from metrale.runtime.spawn import PIPE, Child, read_line, read_some, spawn, spawn_as
from metrale.runtime.spawn_as import can_spawn_as

if TYPE_CHECKING:
    from metrale.runtime.bwrap_config import BwrapConfig

logger = logging.getLogger(__name__)

#: How long stop() waits for the sandbox to die after SIGKILL before it moves on.
STOP_WAIT_S = 10.0


def check_bwrap(config: BwrapConfig | None = None) -> None:
    """`bwrap_setup.check_bwrap` (UsageError when this host cannot give the sandbox), then
    what every start of this process shares, made now, before the first rollout's clock runs:
    the SIGKILL watchdog and, without an image root, the `/etc` copy. Made by the first start
    instead, the copy (~700 entries, ~1 s on a loaded disk) held that start and every start
    queued behind its lock in the worker threads. A copy that cannot be made here is left to
    the first start, which fails with the reason."""
    bwrap_setup.check_bwrap(config)
    if config is not None and config.root is not None:
        return
    tmp = sandbox_tmpdir()
    ensure_watchdog(tmp, WORKDIR_PREFIX)
    with contextlib.suppress(OSError):
        etc_view(etc_root(tmp), owner_prefix(WORKDIR_PREFIX))


def _remove(path: Path) -> None:
    """Blocking: remove the directory `path` and what is in it, if it is there. Most are
    empty by now (a FIFO goes once opened, gsm8k writes no file): one `rmdir` then."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


async def _status_line(fd: int) -> bytes:
    """bwrap's JSON status line (`{"child-pid": N}`) on `fd`, or b"" if bwrap closed it
    first. bwrap writes it before it lets the sandbox run, so by the executor's answer it is
    there to read at once; awaited otherwise (a pipe reader on the loop, ~10 callbacks: not
    made per start when one `read` will do)."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 4096)
    except BlockingIOError:
        data = None
    if data is not None and (data == b"" or b"\n" in data):
        return data.split(b"\n", 1)[0] + b"\n" if data else b""
    rest = await read_line(os.fdopen(os.dup(fd), "rb", 0), READY_TIMEOUT_S)
    return (data or b"") + rest


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class BwrapRuntime(BwrapCommands):
    config: BwrapConfig

    def __init__(self, config: BwrapConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.workdir = None
        #: the executor's control directory (`bwrap_setup.control_dir`), once made
        self.control: Path | None = None
        if privileged():
            self.host_uid = self.host_gid = HOST_UID_BASE + secrets.randbelow(HOST_UID_RANGE)
        else:
            self.host_uid, self.host_gid = os.geteuid(), os.getegid()
        self.sandbox_pid: int | None = None
        self._sandbox = None
        self._executor = None
        self._proc: Child | None = None
        self._stopped = False
        self._cgroup = None
        self._teardown: asyncio.Future[None] | None = None
        self._finish_lock = threading.Lock()
        self._finished = False
        #: what the seed's copy skipped and why (device nodes, FIFOs, sockets)
        self.seed_skipped: list[str] = []

    def _prepare(self, tmp: str) -> Layout:
        """Blocking, in a worker thread (each mkdir here cost the event loop ~0.4 ms at 512
        starts, a memory cgroup's ~2 ms): the workdir, the control directory, what
        `bwrap_layout.fill` makes, and the sandbox's cgroup. The workdir is the one directory
        on the temp dir's disk: on ext4 each new inode cost up to ~1.5 ms of CPU in the 512
        cell (docs/measurements.md, "the disk").

        A start cancelled meanwhile runs `_finish` at once, while this thread may still be
        at work: the workdir is made under `_finish_lock` only if `_finish` has not run, the
        cgroup is handed over under it, and anything made after `_finish` removed what it knew
        of is removed again here, at the end."""
        with self._finish_lock:
            if self._finished:
                raise RuntimeStartError("the start was cancelled")
            self.workdir = Path(tempfile.mkdtemp(prefix=owner_prefix(WORKDIR_PREFIX), dir=tmp))
            # the executor's FIFOs: made by metrale, each owned by the sandbox's uid, in a
            # directory that uid can pass through, not list or write (read-only inside too)
            control = control_dir(self.workdir)
            control.mkdir(mode=0o711)  # refuses whatever is there already (/dev/shm is shared)
            os.chmod(control, 0o711)
            self.control = control
        cgroup = None
        try:
            prepared = self._fill(tmp)
            limits = self.config.limits
            cgroup = SandboxCgroup.create(
                self.workdir.name, max_pids=limits.max_procs, memory_mb=limits.memory_mb
            )
            with self._finish_lock:
                self._cgroup = cgroup
            return prepared
        finally:
            with self._finish_lock:
                if self._finished:
                    self._remove_dirs()
                    if cgroup is not None:
                        cgroup.remove()

    def _fill(self, tmp: str) -> Layout:
        assert self.workdir is not None
        layout, self.seed_skipped = fill(
            self.config, self.workdir, (self.host_uid, self.host_gid), tmp
        )
        return layout

    async def start(self) -> None:
        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        try:
            await self._start()
        except BaseException:
            # failed or cancelled part-way: nothing it made may stay, whether or not the
            # caller goes on to stop() (a cancelled start is often never stopped)
            self._stopped = True
            self._kill()
            if self._proc is not None and self._sandbox is None:
                # not in its cgroups yet (they hold a sandbox once it answers), so removing
                # them waits for nothing: wait for the killed bwrap here
                self._proc.exited_within(STOP_WAIT_S)
            self._finish()
            if self._executor is not None:
                self._executor.close()
            if self._proc is not None:
                self._proc.close_pipes()
            raise

    async def _start(self) -> None:
        tmp = sandbox_tmpdir()
        ensure_watchdog(tmp, WORKDIR_PREFIX)  # kills what a SIGKILLed metrale leaves
        try:
            prepared = await asyncio.to_thread(self._prepare, tmp)
        except OSError as exc:
            raise RuntimeStartError(f"cannot prepare the sandbox's directories: {exc}") from exc
        control = self.control
        assert control is not None  # made by `_prepare`, or it raised
        # bwrap itself, as the sandbox's host uid, made by a spawner thread that takes that
        # uid for the spawn (`spawn_as`); a start that must first bind as root (its private
        # staging), or a machine without `spawn_as`, goes through `unshare` and `setpriv`
        direct = can_spawn_as() and not prepared.staging
        read_fd, write_fd = os.pipe()
        try:
            argv = bwrap_argv(
                self.config,
                self.host_workdir,
                STATUS_FD if direct else write_fd,
                prepared,
                control=control,
            )
        except BaseException:  # e.g. an image root gone since it was checked
            os.close(read_fd)
            os.close(write_fd)
            raise
        try:
            self._proc = await spawned(
                self._spawn(argv, write_fd, direct=direct, staging=prepared.staging),
                lambda proc: proc.pid,
                lambda proc: setattr(self, "_proc", proc),  # so that stop() tears it down
            )
        except OSError as exc:
            os.close(read_fd)
            raise RuntimeStartError(f"cannot run bwrap: {exc}") from exc
        finally:
            os.close(write_fd)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            owner = (self.host_uid, self.host_gid) if privileged() else None
            self._executor = Executor(control, owner)
            # the executor's rlimits; the address space only where no memory cgroup bounds
            # the whole sandbox
            preamble = executor_preamble(
                self.config.limits, address_space=not self.bounds["memory"]
            )
            # b"" when bwrap failed: the executor's stdout closes unanswered
            ready = await self._executor.attach(
                self._proc.stdin, self._proc.stdout, preamble, READY_TIMEOUT_S
            )
            line = await _status_line(read_fd)
        finally:
            os.close(read_fd)
        try:
            pid: int | None = int(json.loads(line)["child-pid"])
        except (ValueError, KeyError, TypeError):
            pid = None
        if pid is None or ready != b"ready\n":
            why = await self._failure_text()
            raise RuntimeStartError(f"bwrap did not start: {why}")
        try:
            self._sandbox = SandboxProcess(pid, self._proc.pid)
        except (OSError, RuntimeError) as exc:
            raise RuntimeStartError(f"bwrap started, but {exc}") from exc
        if self._cgroup is not None:
            # into its cgroups before its first command: the executor forks every command,
            # so everything a command starts is counted there (until now only bwrap and the
            # executor's own start had run, metrale's code)
            try:
                await asyncio.to_thread(self._cgroup.enter, pid, *self._sandbox.keep)
            except OSError as exc:
                raise RuntimeStartError(f"bwrap started, but {exc}") from exc
        self.sandbox_pid = pid

    async def _spawn(
        self, argv: list[str], status_fd: int, *, direct: bool, staging: list[tuple[str, str]]
    ) -> Child:
        ids = (self.host_uid, self.host_gid) if privileged() else None
        if direct:
            return await spawn_as(argv, env=SPAWN_ENV, ids=ids, fds={STATUS_FD: status_fd})
        if ids is not None:
            argv = [*stage_argv(staging), *as_uid(self.host_uid), *argv]
        return await spawn(argv, env=SPAWN_ENV, cwd="/", stdin=PIPE, pass_fds=(status_fd,))

    async def _failure_text(self) -> str:
        assert self._proc is not None
        killpg(self._proc.pid)
        stderr = b""
        if self._proc.stderr is not None:
            stderr = await read_some(self._proc.stderr, 4096, 5)
        text = stderr.decode(errors="replace").strip()
        return text.splitlines()[-1] if text else f"exit {self._proc.returncode}"

    def _kill(self) -> None:
        """Synchronous: SIGKILL bwrap and the sandbox's PID 1 (whose death makes the kernel
        kill everything left in its PID namespace, the executor and every command)."""
        if self._proc is not None and self._proc.returncode is None:
            killpg(self._proc.pid)
        if self._sandbox is not None and self._sandbox.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._sandbox.pidfd, signal.SIGKILL)

    def _finish(self) -> None:
        """Blocking and idempotent: wait for the sandbox to die, remove its cgroups (killing
        any straggler in them) and its temp dir."""
        with self._finish_lock:
            if self._finished:
                return
            if self._sandbox is not None:
                self._sandbox.wait(STOP_WAIT_S)
                self._sandbox.close()
            if self._cgroup is not None:
                self._cgroup.remove()
            self._remove_dirs()
            self._finished = True

    def _remove_dirs(self) -> None:
        if self.workdir is None:
            return
        for path in (self.workdir, self.control, stage_dir(self.workdir)):
            if path is not None:
                _remove(path)

    async def _tear_down(self) -> None:
        """The sandbox's death awaited on the loop, through its pidfd, then `_finish` in a worker
        thread: a thread blocked on each death held one of the few workers that the next
        sandboxes' starts wait for (stops took ~20 ms each at 512 rollouts)."""
        sandbox = self._sandbox
        if sandbox is not None and sandbox.pidfd >= 0:
            loop = asyncio.get_running_loop()
            gone: asyncio.Future[None] = loop.create_future()
            fd = os.dup(sandbox.pidfd)  # its own fd: `_finish` may close the pidfd meanwhile
            loop.add_reader(fd, _settle, gone)
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STOP_WAIT_S):
                        await gone
            finally:
                loop.remove_reader(fd)
                os.close(fd)
        await asyncio.to_thread(self._finish)

    async def stop(self) -> None:
        """Idempotent. The kill is synchronous; the rest runs in a thread that no
        cancellation stops, and a cancelled stop() finishes it synchronously before it
        re-raises, so a run cut short by Ctrl-C still leaves nothing behind."""
        if self._teardown is None:
            self._stopped = True
            self._kill()
            self._teardown = asyncio.ensure_future(self._tear_down())
        try:
            await asyncio.shield(self._teardown)
        except asyncio.CancelledError:
            self._finish()
            raise
        if self._proc is not None:
            try:
                if self._proc.returncode is None:  # mostly reaped by now
                    await asyncio.wait_for(self._proc.wait(), 5)
            except Exception as exc:  # killed above: only a stuck reaper is left to wait for
                logger.warning("bwrap pid %d: no exit status 5 s after its kill: %r",
                               self._proc.pid, exc)  # fmt: skip
            if self._executor is not None:
                self._executor.close()
            self._proc.close_pipes()
