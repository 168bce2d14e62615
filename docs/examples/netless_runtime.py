"""A worked example of a runtime: `netless`, the one docs/extending.md walks through.

Commands run on the host in a fresh temp workdir, each in new user, network and PID namespaces
(`unshare`): a command sees no network but loopback, and when it ends every process it started
ends with it (the PID namespace's first process is gone, so the kernel kills the rest). It is
weaker than bwrap (the file system is the host's) and stronger than subprocess (no network, no
process outlives its command).

One module holds the whole runtime: the config (pydantic, picked by its `type`) and the runtime
itself. tests/docs/test_examples.py copies it into a copy of the source tree as
`src/metrale/runtime/netless.py`, installs the one entry-point line extending.md shows beside
it, and runs it through `metrale exec` and `metrale run`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
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
from metrale.runtime.procs import allowed_env, kill_tree, run_process

#: new user (mapped to root inside), network and PID namespaces; --kill-child: if unshare dies,
#: its child does too
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]


class NetlessConfig(RuntimeConfig):
    """What `--runtime netless` and `runtime_config("netless", ...)` build."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.NETWORK_OFF, Capability.KILL_COMMANDS}
    )
    type: Literal["netless"] = "netless"  # type: ignore[assignment]
    env: dict[str, str] = Field(default_factory=dict)

    def create(self, throttle: Throttle | None = None) -> Runtime:
        return NetlessRuntime(self, throttle)

    def check(self) -> None:
        """Before any rollout: can this machine give the runtime at all? One line if not."""
        if shutil.which("unshare") is None:
            raise UsageError("netless runtime: 'unshare' is not on PATH; accepted: util-linux")
        probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            why = (probe.stderr.strip().splitlines() or ["refused"])[-1]
            raise UsageError(
                f"netless runtime: this machine refuses new namespaces ({why}); "
                "accepted: a host with unprivileged user namespaces"
            )


class NetlessRuntime(RuntimeBase):
    """One sandbox: a workdir, alive from `start()` to `stop()`."""

    config: NetlessConfig

    def __init__(self, config: NetlessConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.workdir: Path | None = None
        self._sessions: set[int] = set()
        self._stopped = False

    async def start(self) -> None:
        await self._await_throttle()  # --runtime-rate: the wait is part of setup
        try:
            self.workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="netless-"))
        except OSError as exc:
            raise RuntimeStartError(f"cannot create a workdir: {exc}") from exc

    def _path(self, path: str) -> Path:
        if self.workdir is None or self._stopped:
            raise RuntimeError("netless runtime is not started")
        return self.workdir / path

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        workdir = self._path(cwd or ".")
        # only the allow-listed part of metrale's environment goes in, then the config's, the call's
        full_env = {**allowed_env(os.environ), "HOME": str(self._path(".")), **self.config.env}
        full_env.update(env or {})
        return await run_process(
            [*UNSHARE, *argv],
            env=full_env,
            cwd=str(workdir),
            timeout=timeout,  # on timeout: exit code 124, its process group killed
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

    async def stop(self) -> None:
        """Idempotent; runs on every path (also after a failed start) and leaves nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self._sessions:
            await asyncio.to_thread(kill_tree, self._sessions)
        if self.workdir is not None:
            await asyncio.to_thread(shutil.rmtree, self.workdir, True)
