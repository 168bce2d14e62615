"""Commands and files in a live bwrap sandbox: each command enters the sandbox's namespaces
with `nsenter` as uid 1000 of its user namespace, in its cgroups and under its rlimits (both
set on the host shell while it waits at its gate, `bwrap_setup.GATE`), so a server started by
one command is reachable on loopback by the next; files inside the workdir move on the host
(`beneath`: no link followed), others through a command inside. The sandbox's life (start,
stop) is `bwrap_runtime`'s, which builds on this class."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from metrale.runtime.base import ProgramResult, RuntimeBase, SandboxLostError
from metrale.runtime.beneath import SymlinkInPath, read_beneath, write_beneath
from metrale.runtime.bwrap_setup import GO, SANDBOX_PATH, SANDBOX_UID, SPAWN_ENV, gate_argv
from metrale.runtime.cgroups import SandboxCgroup
from metrale.runtime.procs import killpg, run_process
from metrale.runtime.sandbox_proc import SandboxProcess, close_all

if TYPE_CHECKING:
    from metrale.runtime.bwrap_config import BwrapConfig

#: What `read()` of a path outside the workdir returns at most, and how long it may take.
READ_CAP_BYTES = 1 << 30
READ_TIMEOUT_S = 300.0
_READ_REGULAR = '[ -f "$0" ] || { echo "not a regular file" >&2; exit 1; }; exec cat -- "$0"'


class BwrapCommands(RuntimeBase):
    """What a command needs of the sandbox: its entry (`_sandbox`), its cgroup, its limits,
    its host uid; `start()` sets them (`bwrap_runtime.BwrapRuntime`)."""

    config: BwrapConfig
    #: the sandbox's host temp dir (`WORKDIR_PREFIX*`); `/work` is its `work/`
    workdir: Path | None
    host_uid: int
    host_gid: int
    _sandbox: SandboxProcess | None
    _cgroup: SandboxCgroup | None
    _stopped: bool
    #: one set per command in flight, holding its process group id while it runs
    _running: list[set[int]]

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
