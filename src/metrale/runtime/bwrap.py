"""The bwrap runtime: one bubblewrap sandbox per rollout, alive from `start()` to `stop()`.

`start()` launches `bwrap ... cat` in new user, mount, PID, IPC, UTS, cgroup and network
namespaces (loopback only unless `network`), system directories and a copy of a few `/etc`
files (`bwrap_etc`) bound read-only, the sandbox's root read-only, the rollout's workdir
writable at `/work`, sized tmpfs at `/tmp` and `/dev/shm` (the rest of `/dev` read-only),
`--die-with-parent` and `--new-session`. It returns when `cat` inside echoes the line fed to
it: bwrap's `--json-status-fd` gives the pid before the uid map is written, so only an answer
from inside means ready.

What holds, and how:

- **No secret of metrale's environment inside, nothing of a command's outside.** bwrap (the
  sandbox's PID 1 is a fork of it) and every host-side wrapper (the gate `sh`, `nsenter`,
  `setpriv`, `unshare`) are absolute paths from `TRUSTED_PATH` started with `SPAWN_ENV` only;
  commands get `_env()` plus the config's `env` (`--env`, an image's `ENV`) and the call's,
  set by `env -i` inside the sandbox. Nothing else of metrale's is in any process inside, and
  no `PATH`/`LD_*`/`PYTHON*` of an image or a task reaches a process on the host.
- **Nothing made inside carries privilege out.** As root, metrale runs bwrap itself as a fresh
  unprivileged host uid per sandbox (`setpriv --reuid`, no groups, no capabilities), so the
  sandbox user maps to that uid, never to 0: a setuid file made inside is setuid to a uid that
  owns nothing. The workdir and writable binds are handed to that uid (chowned, like podman's
  `:U`); bind sources the uid could not reach (`/root/...` is 0700) are first bound by root
  into the sandbox's private staging dir in a private mount namespace (`unshare --mount`), so
  bwrap needs no access to the host path. Run as a normal user, bwrap maps that user, as ever.
- **Commands enter only the live sandbox**: see `sandbox_proc` (verified namespace fds, never
  a pid); a dead sandbox raises `SandboxLostError`, recorded on the rollout as `runtime_lost`.
- **File transfer cannot be steered out**: see `beneath` (no symlink followed, ever); nor
  can the seed's copy into the workdir (`bwrap_seed`: an image's WORKDIR resolved inside the
  image, files and directories only, bounded by `seed_max_mb`).
- **Bounded by default**: total memory and processes by a cgroup per sandbox where the host has
  one (`cgroups`), `/tmp` and `/dev/shm` by tmpfs size, CPU time and file size by rlimits.
  `/work` is host disk bounded only per file (RLIMIT_FSIZE); see the README's table.
- **Every exit path stops it**: bwrap is started through `setpriv --pdeathsig KILL` and a
  shell that checks its parent is still metrale after the signal is armed (`as_uid`), so a
  SIGKILLed metrale takes it along, with no window; `stop()` kills synchronously, and
  finishes waiting, cgroup removal and rmtree even when the awaiting task is cancelled.

Each `run()` enters those namespaces with `nsenter` as uid 1000 of the sandbox's user namespace,
in the sandbox's cgroups and under its rlimits (both set on the host shell while it waits at
its gate, `bwrap_setup.GATE`), so a server started by one command is reachable on loopback by
the next.
"""

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field

from metrale.bounds import FILE_SIZE_MB, TMPFS_MB, pydantic_range
from metrale.errors import UsageError
from metrale.runtime import bwrap_setup
from metrale.runtime.base import (
    Capability,
    CleanupReport,
    ProgramResult,
    Runtime,
    RuntimeBase,
    RuntimeConfig,
    RuntimeStartError,
    SandboxLostError,
    TaskSandbox,
    Throttle,
)
from metrale.runtime.beneath import SymlinkInPath, read_beneath, write_beneath
from metrale.runtime.bwrap_etc import etc_view
from metrale.runtime.bwrap_seed import SeedError, copy_seed, open_in_root
from metrale.runtime.bwrap_setup import (
    GO,
    HOST_UID_BASE,
    HOST_UID_RANGE,
    READY_COMMAND,
    READY_TIMEOUT_S,
    SANDBOX_PATH,
    SANDBOX_UID,
    SPAWN_ENV,
    WORKDIR_PREFIX,
    as_uid,
    gate_argv,
    hand_over,
    leftover_cgroups,
    leftover_workdirs,
    privileged,
    sandbox_tmpdir,
    stage_argv,
    system_binds,
)
from metrale.runtime.bwrap_watchdog import ensure_watchdog, owner_prefix
from metrale.runtime.cgroups import SandboxCgroup
from metrale.runtime.procs import Limits, host_tool, killpg, run_process, spawned
from metrale.runtime.sandbox_proc import SandboxProcess, close_all
from metrale.runtime.spawn import PIPE, Child, read_line, read_some, spawn

logger = logging.getLogger(__name__)

__all__ = [
    "SANDBOX_PATH", "SANDBOX_UID", "WORKDIR_PREFIX", "BwrapRuntime", "check_bwrap",
    "leftover_cgroups", "leftover_workdirs", "system_binds",
]  # fmt: skip

#: How long stop() waits for the sandbox to die after SIGKILL before it moves on.
STOP_WAIT_S = 10.0
#: What `read()` of a path outside the workdir returns at most, and how long it may take.
READ_CAP_BYTES = 1 << 30
READ_TIMEOUT_S = 300.0
_READ_REGULAR = '[ -f "$0" ] || { echo "not a regular file" >&2; exit 1; }; exec cat -- "$0"'
_Binds = list[tuple[str, str, bool]]


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
        etc_view(tmp, owner_prefix(WORKDIR_PREFIX))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _tmpfs(path: str, size_mb: int | None) -> list[str]:
    size = ["--size", str(size_mb << 20)] if size_mb else []
    return [*size, "--tmpfs", path]


class BwrapRuntime(RuntimeBase):
    config: BwrapConfig

    def __init__(self, config: BwrapConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        #: the sandbox's host temp dir (`WORKDIR_PREFIX*`); `/work` is its `work/`
        self.workdir: Path | None = None
        if privileged():
            self.host_uid = self.host_gid = HOST_UID_BASE + secrets.randbelow(HOST_UID_RANGE)
        else:
            self.host_uid, self.host_gid = os.geteuid(), os.getegid()
        self.sandbox_pid: int | None = None
        self._sandbox: SandboxProcess | None = None
        self._proc: Child | None = None
        #: one set per command in flight, holding its process group id while it runs
        self._running: list[set[int]] = []
        self._stopped = False
        self._cgroup: SandboxCgroup | None = None
        self._teardown: asyncio.Future[None] | None = None
        self._finish_lock = threading.Lock()
        self._finished = False
        #: what the seed's copy skipped and why (device nodes, FIFOs, sockets)
        self.seed_skipped: list[str] = []

    @property
    def host_workdir(self) -> Path:
        """The host directory bound writable at `config.workdir`."""
        if self.workdir is None:
            raise RuntimeError("bwrap runtime is not started")
        return self.workdir / "work"

    @property
    def bounds(self) -> dict[str, bool]:
        """Which totals this sandbox's cgroup bounds (False: only the per-process rlimit)."""
        cg = self._cgroup
        return {"memory": bool(cg and cg.bounds_memory), "pids": bool(cg and cg.bounds_pids)}

    def bwrap_argv(
        self, status_fd: int, binds: _Binds, root: str | None = None, etc: str | None = None
    ) -> list[str]:
        """`root`: where bwrap reaches `config.root` (its staging path, as root); `etc`: the
        directory shown at `/etc` when there is no image root (`bwrap_etc`)."""
        cfg = self.config
        argv = [host_tool("bwrap"), "--unshare-all", "--unshare-user"]
        if cfg.network:
            argv.append("--share-net")
        argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        argv += system_binds(cfg.root, root, etc)
        # /dev: bwrap's device nodes, read-only but for a sized /dev/shm; /tmp sized too
        argv += ["--proc", "/proc", "--dev", "/dev", *_tmpfs("/dev/shm", cfg.shm_mb)]
        argv += ["--remount-ro", "/dev", *_tmpfs("/tmp", cfg.tmp_mb)]
        for path in cfg.scratch:
            argv += _tmpfs(path, cfg.tmp_mb)
        argv += ["--bind", str(self.host_workdir), cfg.workdir]
        for src, dst, writable in binds:
            argv += ["--bind" if writable else "--ro-bind", src, dst]
        # the sandbox's own root (a tmpfs holding the mount points) is read-only too: only the
        # workdir, /tmp, /dev/shm and writable binds take writes
        argv += ["--remount-ro", "/"]
        argv += ["--chdir", cfg.workdir, "--clearenv", "--setenv", "PATH", SANDBOX_PATH]
        # bwrap reports the pid before it writes the uid map: "ready" echoed from inside is
        # the signal that commands can enter
        argv += ["--json-status-fd", str(status_fd), "--", *READY_COMMAND]
        return argv

    def _prepare(self, tmp: str) -> tuple[_Binds, list[tuple[str, str]], str | None, str | None]:
        """Blocking, in a worker thread (each mkdir here cost the event loop ~0.4 ms at 512
        starts, a memory cgroup's ~2 ms): the workdir (filled from `seed`) and writable binds
        handed to the sandbox's uid, (as root) a staging path per bind and for the image root,
        the `/etc` copy, and the sandbox's cgroup. Returns bwrap's binds, root's staging pairs,
        where bwrap reaches the image root and the `/etc` to bind.

        A start cancelled meanwhile runs `_finish` at once, while this thread may still be
        at work: the workdir is made under `_finish_lock` only if `_finish` has not run, the
        cgroup is handed over under it, and anything made after `_finish` removed what it knew
        of is removed again here, at the end."""
        with self._finish_lock:
            if self._finished:
                raise RuntimeStartError("the start was cancelled")
            self.workdir = Path(tempfile.mkdtemp(prefix=owner_prefix(WORKDIR_PREFIX), dir=tmp))
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
                    shutil.rmtree(self.workdir, ignore_errors=True)
                    if cgroup is not None:
                        cgroup.remove()

    def _fill(self, tmp: str) -> tuple[_Binds, list[tuple[str, str]], str | None, str | None]:
        assert self.workdir is not None
        os.chmod(self.workdir, 0o711)
        if not self._seed():
            self.host_workdir.mkdir(mode=0o700)
        os.chown(self.host_workdir, self.host_uid, self.host_gid)
        binds: _Binds = []
        staging: list[tuple[str, str]] = []
        root = self.config.root
        if root is not None and privileged():
            (self.workdir / "stage").mkdir(mode=0o711)
            os.chmod(self.workdir / "stage", 0o711)
            staged_root = self.workdir / "stage" / "root"
            staged_root.mkdir()
            staging.append((os.path.abspath(root), str(staged_root)))
            root = str(staged_root)
        for i, bind in enumerate(self.config.binds):
            src = os.path.abspath(bind.src)
            if not os.path.lexists(src):
                raise RuntimeStartError(f"bind source {src} does not exist")
            if privileged():
                if bind.writable:
                    hand_over(Path(src), self.host_uid)
                staged = self.workdir / "stage" / str(i)
                staged.parent.mkdir(mode=0o711, exist_ok=True)
                os.chmod(staged.parent, 0o711)
                if os.path.isdir(src):
                    staged.mkdir()
                else:
                    staged.touch()
                staging.append((src, str(staged)))
                src = str(staged)
            binds.append((src, bind.dst or bind.src, bind.writable))
        # an image brings its own /etc
        etc = None if self.config.root is not None else etc_view(tmp, owner_prefix(WORKDIR_PREFIX))
        return binds, staging, root, etc

    def _seed(self) -> bool:
        """Fill the workdir from the seed (`bwrap_seed`: no link followed on the host, only
        files and directories, bounded); False when there is nothing to copy."""
        cfg = self.config
        try:
            if cfg.seed_from_root and cfg.root is not None:
                src_fd = open_in_root(cfg.root, cfg.workdir)
            elif cfg.seed is not None:
                src_fd = os.open(cfg.seed, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                return False
            if src_fd is None:  # a WORKDIR the image lacks: empty, as docker makes it
                return False
            try:
                seeded = copy_seed(src_fd, self.host_workdir, cfg.seed_max_mb << 20)
            finally:
                os.close(src_fd)
        except SeedError as exc:
            raise RuntimeStartError(str(exc)) from exc
        self.seed_skipped = seeded.skipped
        hand_over(self.host_workdir, self.host_uid)
        return True

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
            self._finish()
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
        binds, staging, root, etc = prepared
        assert self.workdir is not None
        read_fd, write_fd = os.pipe()
        try:
            argv = self.bwrap_argv(write_fd, binds, root, etc)
        except BaseException:  # e.g. an image root gone since it was checked
            os.close(read_fd)
            os.close(write_fd)
            raise
        # every step execs in place (metrale stays the parent) and the last checks that it
        # still is, after the death signal is armed: no preexec_fn, so no fork() on the loop
        uid = self.host_uid if privileged() else None
        argv = [*stage_argv(staging), *as_uid(uid, os.getpid()), *argv]
        # moved into its cgroups by the spawner while the shell after setpriv waits at its gate
        enter = self._cgroup.enter if self._cgroup is not None else None
        try:
            self._proc = await spawned(
                spawn(
                    argv,
                    env=SPAWN_ENV,
                    cwd="/",
                    stdin=PIPE,
                    pass_fds=(write_fd,),
                    before_go=enter,
                    go=GO,
                ),
                lambda proc: proc.pid,
                lambda proc: setattr(self, "_proc", proc),  # so that stop() tears it down
            )  # cwd "/": a shell on the way would put metrale's cwd into PWD
        except OSError as exc:
            os.close(read_fd)
            raise RuntimeStartError(f"cannot run bwrap: {exc}") from exc
        finally:
            os.close(write_fd)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        os.write(self._proc.stdin.fileno(), b"ready\n")  # 6 bytes into an empty pipe
        status = os.fdopen(read_fd, "rb", 0)
        line = await read_line(status, READY_TIMEOUT_S)
        ready = await read_line(self._proc.stdout, READY_TIMEOUT_S) if line else b""
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
        self.sandbox_pid = pid

    async def _failure_text(self) -> str:
        assert self._proc is not None
        killpg(self._proc.pid)
        stderr = b""
        if self._proc.stderr is not None:
            stderr = await read_some(self._proc.stderr, 4096, 5)
        text = stderr.decode(errors="replace").strip()
        return text.splitlines()[-1] if text else f"exit {self._proc.returncode}"

    def _enter(
        self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, stdin: bool
    ) -> tuple[list[str], list[int]]:
        """The host argv that runs `argv` inside with exactly `env`, and the fds it must be
        given. The host-side steps (the gate's `sh`, `nsenter`) are absolute paths run with
        `SPAWN_ENV` (cgroups and limits are set on the waiting shell: `_before_command`); `env`
        is set by `env -i` only once inside, so nothing of an image's or a command's
        environment (`PATH`, `LD_PRELOAD`, `LD_DEBUG_OUTPUT`, ...) acts on a host process.
        nsenter finds `env` in the sandbox's own root."""
        if self._sandbox is None or self._stopped:
            raise RuntimeError("bwrap runtime is not started")
        fds = self._sandbox.open_entry()  # SandboxLostError when it is gone
        if cwd:
            argv = ["sh", "-c", 'cd -- "$0" && exec "$@"', cwd, *argv]
        assignments = [f"{k}={v}" for k, v in env.items() if k and "=" not in k]
        argv = ["env", "-i", "--", *assignments, *argv]
        nsenter = SandboxProcess.nsenter_argv(fds, SANDBOX_UID, SANDBOX_UID)
        return [*gate_argv(stdin=stdin), *nsenter, *argv], fds

    def _before_command(self, pid: int) -> None:
        """On the spawner thread, while the command's host shell waits at its gate: into the
        sandbox's cgroups, under its limits (RLIMIT_AS only where no memory cgroup bounds it)."""
        if self._cgroup is not None:
            self._cgroup.enter(pid)
        self.config.limits.apply(pid, address_space=not self.bounds["memory"])

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": self.config.workdir,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
        }
        env.update(self.config.env)
        env.update(extra or {})
        return env

    async def _exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        cap: int | None = None,
    ) -> ProgramResult:
        running: set[int] = set()
        self._running.append(running)
        try:
            command, fds = self._enter(argv, cwd, self._env(env), stdin=stdin is not None)
            try:
                result = await run_process(
                    command,
                    env=SPAWN_ENV,
                    cwd=None,
                    timeout=timeout,
                    cap=cap or self.config.output_cap_bytes,
                    stdin=stdin,
                    sessions=running,
                    pass_fds=fds,
                    before_go=self._before_command,
                    go=GO,
                )
            finally:
                close_all(fds)
        finally:
            self._running.remove(running)
        await self._check_alive(result)
        return result

    async def _check_alive(self, result: ProgramResult) -> None:
        """SandboxLostError when the sandbox died during the command: its result (killed with
        everything else, or nsenter failing to fork in a dying PID namespace) is not the
        command's. PID 1 dies shortly after the rest, so those two cases wait for it briefly."""
        assert self._sandbox is not None
        killed = result.exit_code < 0 and not result.timed_out  # e.g. by `kill -9 -1` inside
        if killed or (result.exit_code != 0 and result.stderr.startswith("nsenter: ")):
            for _ in range(100):  # PID 1 may still be on its way out: up to 1 s
                if not self._sandbox.alive():
                    break
                await asyncio.sleep(0.01)
        if not self._sandbox.alive():
            raise SandboxLostError("the sandbox died during the command (its PID 1 exited)")

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        return await self._exec(argv, env=env, cwd=cwd, timeout=timeout)

    async def kill_commands(self) -> None:
        """Every process in the sandbox's PID namespace but its PID 1 and `cat`, killed from
        the host (no process started for it): a `setsid` daemon cannot hide from a namespace."""
        if self._sandbox is None or self._stopped:
            raise RuntimeError("bwrap runtime is not started")
        for running in list(self._running):
            for pgid in running:
                killpg(pgid)
        await asyncio.to_thread(self._sandbox.kill_commands)
        if not self._sandbox.alive():
            raise SandboxLostError("the sandbox died while its commands were killed")

    def _beneath(self, path: str) -> str | None:
        """`path` relative to the host workdir when the host may move the file itself: inside
        the workdir and not under a bind mounted there (which the host's copy does not see)."""
        inside = os.path.normpath(os.path.join(self.config.workdir, path))
        root = self.config.workdir.rstrip("/")
        if not inside.startswith(root + "/"):
            return None
        for bind in self.config.binds:
            dst = os.path.normpath(bind.dst or bind.src)
            if inside == dst or inside.startswith(dst + "/"):
                return None
        return os.path.relpath(inside, root)

    async def read(self, path: str) -> bytes:
        rel = self._beneath(path)
        if rel is not None:
            with contextlib.suppress(SymlinkInPath):  # links resolve inside, as the sandbox's
                return await asyncio.to_thread(read_beneath, str(self.host_workdir), rel)
        # inside: links resolve to the sandbox's own files; only a regular file, in bounded
        # time (a FIFO or /dev/zero there must not hold the rollout or fill metrale's memory)
        argv = ["sh", "-c", _READ_REGULAR, path]
        result = await self._exec(argv, cap=READ_CAP_BYTES, timeout=READ_TIMEOUT_S)
        if result.timed_out:
            raise OSError(f"{path}: not read within {READ_TIMEOUT_S:g} s")
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path}: {result.stderr.strip()}")
        return result.stdout.encode()

    async def write(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        rel = self._beneath(path)
        if rel is not None:
            owner = (self.host_uid, self.host_gid)
            with contextlib.suppress(SymlinkInPath):
                await asyncio.to_thread(
                    write_beneath, str(self.host_workdir), rel, payload, owner=owner
                )
                return
        result = await self._exec(
            ["sh", "-c", 'mkdir -p -- "$(dirname -- "$0")" && cat > "$0"', path], stdin=payload
        )
        if result.exit_code != 0:
            raise OSError(f"cannot write {path} in the sandbox: {result.stderr.strip()}")

    def _kill(self) -> None:
        """Synchronous: SIGKILL the commands in flight, bwrap, and the sandbox's PID 1 (whose
        death makes the kernel kill everything left in its PID namespace)."""
        for running in list(self._running):
            for pgid in running:
                killpg(pgid)
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
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self._finished = True

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
                    await asyncio.wait_for(gone, STOP_WAIT_S)
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
                await asyncio.wait_for(self._proc.wait(), 5)
            except Exception as exc:  # killed above: only a stuck reaper is left to wait for
                logger.warning("bwrap pid %d: no exit status 5 s after its kill: %r",
                               self._proc.pid, exc)  # fmt: skip
            self._proc.close_pipes()


#: Flat option names `runtime_config("bwrap", ...)` takes for binds: `SRC` or `SRC:DST`.
_BIND_KEYS = ("ro_binds", "rw_binds")
#: Where the agent starts over an image root that names no WORKDIR (bwrap cannot bind at /).
FALLBACK_WORKDIR = "/work"


class Bind(BaseModel):
    """A host path made visible inside a bwrap sandbox (read-only unless `writable`)."""

    src: str
    dst: str | None = Field(default=None, description="path inside; default: same as src")
    writable: bool = False

    @classmethod
    def parse(cls, text: str, *, writable: bool) -> Bind:
        """`SRC` or `SRC:DST`."""
        src, _, dst = text.partition(":")
        if not src:
            raise UsageError(f"bind {text!r} must be SRC or SRC:DST")
        return cls(src=src, dst=dst or None, writable=writable)


class BwrapConfig(RuntimeConfig):
    """A bubblewrap sandbox: read-only system dirs, a writable workdir, private sized /tmp and
    /dev/shm, new user/PID/IPC/UTS/network namespaces (loopback only unless `network`).

    `limits.memory_mb` is the sandbox's total memory (tmpfs included) where a memory cgroup can
    be made, else per process (RLIMIT_AS); `limits.max_procs` its process count (pids cgroup,
    else RLIMIT_NPROC)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.TASK_IMAGE,
            Capability.HOST_PATHS,
            Capability.NETWORK_OFF,
            Capability.NETWORK,
            Capability.BOUNDS,
            Capability.LEFTOVERS,
            Capability.KILL_COMMANDS,
        }
    )
    type: Literal["bwrap"] = "bwrap"
    limits: Limits = Field(default_factory=Limits)
    binds: list[Bind] = Field(default_factory=list)
    network: bool = False
    workdir: str = Field(default="/work", description="the workdir's path inside the sandbox")
    env: dict[str, str] = Field(default_factory=dict)
    tmp_mb: int | None = Field(
        default=512, description="size of the sandbox's /tmp", **pydantic_range(TMPFS_MB)
    )
    shm_mb: int | None = Field(
        default=64, description="size of the sandbox's /dev/shm", **pydantic_range(TMPFS_MB)
    )
    root: str | None = Field(
        default=None,
        description="a host directory holding a whole root file system (an exported image) "
        "whose top-level entries are shown read-only in place of the host's system dirs",
    )
    seed: str | None = Field(
        default=None,
        description="a host directory whose contents are copied into the workdir at start",
    )
    seed_from_root: bool = Field(
        default=False,
        description="copy `workdir` as it is inside `root` (an image's WORKDIR, resolved within "
        "the image) into the workdir at start; absent there: an empty workdir, as docker makes",
    )
    seed_max_mb: int = Field(
        default=1024,
        description="the most a seed may hold (file sizes, sparse or not)",
        **pydantic_range(FILE_SIZE_MB),
    )
    scratch: list[Annotated[str, Field(pattern="^/")]] = Field(
        default_factory=list,
        description="absolute paths that get an empty writable tmpfs (tmp_mb each)",
    )

    def create(self, throttle: Throttle | None = None) -> Runtime:
        return BwrapRuntime(self, throttle)

    def check(self) -> None:
        check_bwrap(self)

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Besides the shared flat options, `ro_binds` / `rw_binds`: `SRC` or `SRC:DST`."""
        binds = {k: options.pop(k) for k in _BIND_KEYS if k in options}
        for key, value in binds.items():
            if not isinstance(value, list | tuple) or not all(isinstance(b, str) for b in value):
                raise UsageError(
                    f"bad bwrap runtime option {key}: {value!r}; accepted: a list of SRC or "
                    "SRC:DST paths"
                )
        fields = super().from_flat(options)
        if binds:
            parsed = list(fields.pop("binds", []))
            parsed += [Bind.parse(b, writable=False) for b in binds.get("ro_binds", [])]
            parsed += [Bind.parse(b, writable=True) for b in binds.get("rw_binds", [])]
            fields["binds"] = parsed
        return fields

    @classmethod
    def flat_keys(cls) -> list[str]:
        return [*super().flat_keys(), *_BIND_KEYS]

    def image_form(self) -> str | None:
        return "rootfs"

    def for_task(self, task: TaskSandbox) -> RuntimeConfig:
        """Over the image's exported root: its WORKDIR copied in as the workdir (bwrap cannot
        bind at /: an image without one gets `FALLBACK_WORKDIR`), its ENV under the user's."""
        update: dict[str, Any] = {"scratch": sorted({*self.scratch, *task.scratch})}
        if task.rootfs is not None:
            workdir = task.workdir if task.workdir not in (None, "/") else None
            update.update(
                root=task.rootfs,
                seed=None,
                seed_from_root=workdir is not None,
                workdir=workdir or FALLBACK_WORKDIR,
                env={**task.env, **self.env},
            )
        if task.memory_mb is not None:
            update["limits"] = self.limits.model_copy(update={"memory_mb": task.memory_mb})
        # exactly as the task says: the host's network namespace only when it allows the
        # internet (the one network bwrap can give), else loopback only
        update["network"] = task.internet
        return self.model_copy(update=update)

    def with_paths(
        self, read_only: Sequence[str], writable: Mapping[str, str]
    ) -> tuple[RuntimeConfig, dict[str, str]]:
        binds = [Bind(src=path) for path in read_only]
        binds += [Bind(src=host, dst=inside, writable=True) for host, inside in writable.items()]
        return self.model_copy(update={"binds": [*self.binds, *binds]}), dict(writable)

    def cleanup(self, report: CleanupReport, *, everything: bool = False) -> None:
        from metrale.runtime.bwrap_leftovers import clean_bwrap

        clean_bwrap(report)
