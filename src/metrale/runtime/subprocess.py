"""The subprocess runtime: commands on the host, in a fresh temp workdir.

Setup is one `mkdtemp`, so this is the baseline every other runtime's setup is compared with.
Each command runs in its own session; `stop()` kills every process of those sessions and every
process carrying this sandbox's marker in its environment (`METRALE_SANDBOX=<id>`), which is
how `setsid cmd &` children, which leave the session, are still found. A command that clears
its environment *and* leaves the session escapes: for model-authored code use bwrap.

A command inherits only the allow-listed part of metrale's environment (`HOST_ENV_ALLOW`:
PATH, locale, TERM, TZ, TMPDIR, USER, LOGNAME, SHELL), HOME set to the workdir, plus what the
config's `env` (`--env`) and the call pass. It still runs as metrale's user, on the host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from metrale.errors import UsageError
from metrale.runtime.base import (
    Capability,
    ProgramResult,
    Runtime,
    RuntimeBase,
    RuntimeConfig,
    RuntimeStartError,
    Throttle,
)
from metrale.runtime.procs import Limits, allowed_env, kill_tree, run_process

MARKER_VAR = "METRALE_SANDBOX"


class SubprocessRuntime(RuntimeBase):
    config: SubprocessConfig

    def __init__(self, config: SubprocessConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.id = uuid.uuid4().hex
        self.workdir: Path | None = None
        self._sessions: set[int] = set()
        self._stopped = False

    @property
    def marker(self) -> bytes:
        return f"{MARKER_VAR}={self.id}".encode()

    async def start(self) -> None:
        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix="metrale-sbx-"))
        except OSError as exc:
            raise RuntimeStartError(f"cannot create a workdir: {exc}") from exc

    def _require(self) -> Path:
        if self.workdir is None or self._stopped:
            raise RuntimeError("subprocess runtime is not started")
        return self.workdir

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        workdir = self._require()
        env = allowed_env(os.environ)
        env.update(HOME=str(workdir), PWD=str(workdir), **{MARKER_VAR: self.id})
        env.update(self.config.env)
        env.update(extra or {})
        env[MARKER_VAR] = self.id
        return env

    def _path(self, path: str) -> Path:
        return self._require() / path

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        return await run_process(
            [*self.config.limits.prlimit_argv(), *argv],
            env=self._env(env),
            cwd=str(self._path(cwd or ".")),
            timeout=timeout,
            cap=self.config.output_cap_bytes,
            sessions=self._sessions,
        )

    async def read(self, path: str) -> bytes:
        return await asyncio.to_thread(self._path(path).read_bytes)

    async def write(self, path: str, data: bytes | str) -> None:
        target = self._path(path)
        payload = data.encode() if isinstance(data, str) else data

        def put() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(payload)

        await asyncio.to_thread(put)

    async def kill_commands(self) -> None:
        """The sessions of every command, and every process carrying this sandbox's marker."""
        self._require()
        await asyncio.to_thread(kill_tree, set(self._sessions), self.marker)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._sessions:
            await asyncio.to_thread(kill_tree, self._sessions, self.marker)
        if self.workdir is not None:
            await asyncio.to_thread(shutil.rmtree, self.workdir, True)


class SubprocessConfig(RuntimeConfig):
    """Commands on the host in a fresh temp workdir: the cheapest runtime, and no isolation
    beyond a scrubbed environment, limits and process-group cleanup."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.HOST_PATHS, Capability.NETWORK, Capability.KILL_COMMANDS}
    )
    type: Literal["subprocess"] = "subprocess"
    #: RLIMIT_NPROC counts all of the host user's processes here, so it is off by default.
    limits: Limits = Field(default_factory=lambda: Limits(max_procs=None))
    env: dict[str, str] = Field(default_factory=dict)

    def create(self, throttle: Throttle | None = None) -> Runtime:
        return SubprocessRuntime(self, throttle)

    def check(self) -> None:
        limited = any(v is not None for v in self.limits.model_dump().values())
        if limited and not shutil.which("prlimit"):
            raise UsageError("subprocess runtime: resource limits need 'prlimit' (util-linux)")

    def with_paths(
        self, read_only: Sequence[str], writable: Mapping[str, str]
    ) -> tuple[RuntimeConfig, dict[str, str]]:
        """Commands run on the host: every path is where it is, nothing is read-only."""
        return self, {host: host for host in writable}
