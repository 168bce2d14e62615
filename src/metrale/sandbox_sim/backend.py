"""The real sandboxes behind a sandbox-service emulator: each one a metrale runtime instance.

An emulator (`sandbox_sim.prime`, `sandbox_sim.modal`) speaks a service's wire protocol and
hands the work to a `Backend`, so what the SDK drives is a real sandbox (a bwrap sandbox, or a
container of the local engine) and not a stand-in that answers what a test expects.

- `bwrap` (the default): cheap, no engine needed, fine at 1,024 sandboxes; the host's system
  is the root unless an image name is mapped to an exported root file system (`NAME=DIR`).
- `docker`: the container engine, for task images; a registry name the local engine has is
  used as is, or mapped to a local image (`NAME=LOCAL`). Nothing is ever pulled.
- `auto`: docker when an engine answers, else bwrap.

A sandbox has the network its creation asked for: none but loopback (bwrap's own network
namespace, docker's `none`), or what the host reaches (bwrap's `--share-net`, the engine's
bridge). A service's finer egress rules (allowlists) are not emulated: the emulators refuse
them rather than give more or less than was asked.

`close()` deletes every sandbox still live; the emulators call it on every exit path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from metrale.errors import UsageError
from metrale.runtime.base import ProgramResult, Runtime, RuntimeConfig, RuntimeStartError

logger = logging.getLogger(__name__)

BACKENDS = ("bwrap", "docker", "auto")
#: real sandboxes starting at once on this machine: a burst of 1,024 creations must cost the
#: emulator's host its uncontended start each, not the kernel's contention (which the service
#: being emulated would not show)
STARTS_IN_FLIGHT = 4 * (os.cpu_count() or 1)
#: What one command's stdout (and stderr) may hold inside the emulator: a service streams
#: more than any runtime keeps, and the client caps what it keeps itself.
EXEC_CAP_BYTES = 128 << 20


class SandboxGone(KeyError):
    """No live sandbox has this id (never made, deleted, or its backend start failed)."""


@dataclass
class LiveSandbox:
    id: str
    image: str
    labels: dict[str, str]
    created_at: float
    runtime: Runtime = field(repr=False)


def parse_image_map(pairs: Sequence[str]) -> dict[str, str]:
    """`NAME=LOCAL` pairs (repeatable `--image`) as a dict; anything else is a usage error."""
    mapped: dict[str, str] = {}
    for pair in pairs:
        name, sep, local = pair.partition("=")
        if not sep or not name or not local:
            raise UsageError(
                f"--image {pair!r} must be NAME=LOCAL (a registry name = a local image, or "
                "with bwrap a directory holding an exported root)"
            )
        mapped[name] = local
    return mapped


def engine_answers(cli: str = "docker") -> bool:
    """Whether a container engine answers `cli` (for `--backend auto`)."""
    if shutil.which(cli) is None:
        return False
    try:
        probe = subprocess.run(
            [cli, "version", "--format", "{{.Server.Version}}"],
            capture_output=True, text=True, timeout=15, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and bool(probe.stdout.strip())


class Backend:
    """Real sandboxes, created, used and deleted by id; safe to share between requests."""

    def __init__(self, kind: str = "bwrap", images: Mapping[str, str] | None = None) -> None:
        if kind not in BACKENDS:
            raise UsageError(f"unknown --backend {kind!r}; accepted: {', '.join(BACKENDS)}")
        if kind == "auto":
            kind = "docker" if engine_answers() else "bwrap"
        self.kind = kind
        self.images = dict(images or {})
        if kind == "bwrap":
            for name, root in self.images.items():
                if not os.path.isdir(root):
                    raise UsageError(
                        f"--image {name}={root}: with the bwrap backend LOCAL must be a "
                        "directory holding an exported root file system"
                    )
        self._live: dict[str, LiveSandbox] = {}
        self._closing = False
        self._starting = asyncio.Semaphore(STARTS_IN_FLIGHT)

    def check(self) -> None:
        """UsageError when this machine cannot give the chosen backend's sandboxes at all."""
        self._config("check", {}, 1.0, 1024, "/work", network=False).check()

    def _config(
        self,
        image: str,
        env: Mapping[str, str],
        cpu: float,
        memory_mb: int,
        workdir: str,
        *,
        network: bool,
    ) -> RuntimeConfig:
        from metrale.runtime.bwrap import BwrapConfig
        from metrale.runtime.docker import DockerConfig
        from metrale.runtime.procs import Limits

        if self.kind == "docker":
            # `check`: the engine only, with the default image scripts/container-engine.sh builds
            config = DockerConfig(
                cpus=cpu, memory_mb=memory_mb, workdir=workdir, env=dict(env),
                output_cap_bytes=EXEC_CAP_BYTES, network="bridge" if network else "none",
            )  # fmt: skip
            if image != "check":
                config.image = self.images.get(image, image)
            return config
        return BwrapConfig(
            root=self.images.get(image), limits=Limits(memory_mb=memory_mb), workdir=workdir,
            env=dict(env), output_cap_bytes=EXEC_CAP_BYTES, network=network,
        )  # fmt: skip

    async def create(
        self,
        image: str,
        *,
        env: Mapping[str, str] | None = None,
        cpu: float = 1.0,
        memory_mb: int = 2048,
        workdir: str = "/work",
        labels: Mapping[str, str] | None = None,
        network: bool = False,
    ) -> str:
        """A started sandbox's id, with the host's network or (`network` False) loopback only.
        RuntimeStartError when it cannot start (an image the engine lacks, a start that
        failed): nothing of it is left."""
        if self._closing:
            raise RuntimeStartError("the emulator is shutting down")
        config = self._config(image, env or {}, cpu, memory_mb, workdir, network=network)
        if self.kind == "docker":
            from metrale.runtime.configs import check_runtime

            try:
                await asyncio.to_thread(check_runtime, config)
            except UsageError as exc:
                raise RuntimeStartError(str(exc)) from None
        runtime = config.create()
        try:
            async with self._starting:
                await runtime.start()
        except BaseException:
            await runtime.stop()
            raise
        sandbox_id = uuid.uuid4().hex
        self._live[sandbox_id] = LiveSandbox(
            sandbox_id, image, dict(labels or {}), time.time(), runtime
        )
        if self._closing:  # close() ran while this one started
            await self.delete(sandbox_id)
            raise RuntimeStartError("the emulator is shutting down")
        return sandbox_id

    def get(self, sandbox_id: str) -> LiveSandbox:
        try:
            return self._live[sandbox_id]
        except KeyError:
            raise SandboxGone(sandbox_id) from None

    async def exec(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        """The command's result (exit, stdout, stderr, timed_out). SandboxLostError when the
        sandbox died under it, SandboxGone when it is not live."""
        return await self.get(sandbox_id).runtime.run(list(argv), env=env, cwd=cwd, timeout=timeout)

    async def read(self, sandbox_id: str, path: str) -> bytes:
        return await self.get(sandbox_id).runtime.read(path)

    async def write(self, sandbox_id: str, path: str, data: bytes) -> None:
        await self.get(sandbox_id).runtime.write(path, data)

    async def delete(self, sandbox_id: str) -> bool:
        """Stop and forget it; False when it was not live."""
        sandbox = self._live.pop(sandbox_id, None)
        if sandbox is None:
            return False
        await sandbox.runtime.stop()
        return True

    def live(self) -> list[LiveSandbox]:
        return list(self._live.values())

    async def close(self) -> None:
        """Delete every live sandbox (and any that finishes starting after this)."""
        self._closing = True
        ids = list(self._live)
        if ids:
            logger.info("deleting %d live sandbox(es)", len(ids))
        results = await asyncio.gather(*(self.delete(i) for i in ids), return_exceptions=True)
        for sandbox_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("sandbox %s: stop failed: %r", sandbox_id, result)
