"""Commands and files in a live bwrap sandbox: each command is forked inside by the sandbox's
executor (`bwrap_exec`), so it runs as uid 1000 of the sandbox's user namespace, in its
cgroups and under its rlimits (set on the sandbox at its start), and a server started by one
command is reachable on loopback by the next; files inside the workdir move on the host
(`beneath`: no link followed), others through a command inside. The sandbox's life (start,
stop) is `bwrap_runtime`'s, which builds on this class."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from metrale.runtime.base import ProgramResult, RuntimeBase, SandboxLostError
from metrale.runtime.beneath import SymlinkInPath, read_beneath, write_beneath
from metrale.runtime.bwrap_exec import Executor
from metrale.runtime.bwrap_setup import SANDBOX_PATH
from metrale.runtime.cgroups import SandboxCgroup
from metrale.runtime.procs import CappedBuffer
from metrale.runtime.sandbox_proc import SandboxProcess

if TYPE_CHECKING:
    from metrale.runtime.bwrap_config import BwrapConfig

#: What `read()` of a path outside the workdir returns at most, and how long it may take.
READ_CAP_BYTES = 1 << 30
READ_TIMEOUT_S = 300.0
_READ_REGULAR = '[ -f "$0" ] || { echo "not a regular file" >&2; exit 1; }; exec cat -- "$0"'


class BwrapCommands(RuntimeBase):
    """What a command needs of the sandbox: its executor, its PID 1 (`_sandbox`), its cgroup;
    `start()` sets them (`bwrap_runtime.BwrapRuntime`)."""

    config: BwrapConfig
    #: the sandbox's workdir on the host (`WORKDIR_PREFIX*`), bound at `config.workdir`
    workdir: Path | None
    host_uid: int
    host_gid: int
    _sandbox: SandboxProcess | None
    _executor: Executor | None
    _cgroup: SandboxCgroup | None
    _stopped: bool

    @property
    def host_workdir(self) -> Path:
        """The host directory bound writable at `config.workdir`."""
        if self.workdir is None:
            raise RuntimeError("bwrap runtime is not started")
        return self.workdir

    @property
    def bounds(self) -> dict[str, bool]:
        """Which totals this sandbox's cgroup bounds (False: only the per-process rlimit)."""
        cg = self._cgroup
        return {"memory": bool(cg and cg.bounds_memory), "pids": bool(cg and cg.bounds_pids)}

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
        out: CappedBuffer | None = None,
    ) -> ProgramResult:
        sandbox, executor = self._sandbox, self._executor
        if sandbox is None or executor is None or self._stopped:
            raise RuntimeError("bwrap runtime is not started")
        if executor.ended.done() or not sandbox.whole():
            await self._lost()
        try:
            result = await executor.run(
                argv,
                env=self._env(env),
                cwd=cwd,
                timeout=timeout,
                stdin=stdin,
                cap=cap or self.config.output_cap_bytes,
                cpu_s=self.config.limits.cpu_s,
                kill_tree=sandbox.kill_tree,
                out=out,
            )
        except RuntimeError:  # the executor ended meanwhile
            await self._lost()
        if executor.ended.done() or not sandbox.whole():  # not the command's result: the
            await self._lost()  # sandbox died under it
        return result

    async def _lost(self) -> NoReturn:
        """The executor ended: so does the sandbox (its PID 1 follows its first child out,
        shortly after). SandboxLostError either way, once PID 1 is gone or after 1 s."""
        assert self._sandbox is not None
        for _ in range(100):
            if not self._sandbox.alive():
                break
            await asyncio.sleep(0.01)
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
        """Every process in the sandbox's PID namespace but its PID 1 and the executor, killed
        from the host (no process started for it): a `setsid` daemon cannot hide from a
        namespace. Commands in flight end as killed."""
        if self._sandbox is None or self._executor is None or self._stopped:
            raise RuntimeError("bwrap runtime is not started")
        await asyncio.to_thread(self._sandbox.kill_commands)
        self._executor.killed_all()
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
        # time (a FIFO or /dev/zero there must not hold the rollout or fill metrale's memory),
        # its bytes as they are (the result's stdout is text, invalid UTF-8 replaced)
        content = CappedBuffer(READ_CAP_BYTES)
        argv = ["sh", "-c", _READ_REGULAR, path]
        result = await self._exec(argv, cap=READ_CAP_BYTES, timeout=READ_TIMEOUT_S, out=content)
        if result.timed_out:
            raise OSError(f"{path}: not read within {READ_TIMEOUT_S:g} s")
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path}: {result.stderr.strip()}")
        if content.dropped:
            raise OSError(f"{path}: larger than {READ_CAP_BYTES >> 20} MiB, not read")
        return content.data()

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
