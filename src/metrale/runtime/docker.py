"""The docker runtime: one container per rollout through any docker-compatible CLI.

`start()` is `docker run -d` of the image with `sleep infinity` (network `none` by default, CPU,
memory and process limits, the `metrale.sandbox` label); `run()` is `docker exec`, wrapped in
the image's `timeout` so a command that outlives its limit is killed inside the container, not
only its client; `stop()` is `docker rm -f`. Containers that a killed run left behind carry the
label, and `metrale cleanup` removes them.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Mapping, Sequence

from metrale.errors import UsageError
from metrale.runtime.base import ProgramResult, RuntimeBase, RuntimeStartError, Throttle
from metrale.runtime.configs import DockerConfig
from metrale.runtime.procs import run_process

LABEL = "metrale.sandbox"
#: Seconds past a command's timeout before its `docker exec` client is killed as well.
CLIENT_GRACE_S = 5.0


class DockerRuntime(RuntimeBase):
    config: DockerConfig

    def __init__(self, config: DockerConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.name = f"metrale-{uuid.uuid4().hex[:16]}"
        self.container: str | None = None
        self._stopped = False

    def run_argv(self) -> list[str]:
        cfg = self.config
        # --init: a tiny PID 1 that reaps the orphans a command's background jobs leave (sleep
        # as PID 1 would let them pile up as zombies for the sandbox's whole life)
        argv = [cfg.cli, "run", "-d", "--rm", "--init", "--name", self.name]
        argv += ["--label", f"{LABEL}=1"]
        argv += ["--label", f"{LABEL}.pid={os.getpid()}", "--network", cfg.network]
        if cfg.cpus is not None:
            argv += ["--cpus", str(cfg.cpus)]
        if cfg.memory_mb is not None:
            argv += ["--memory", f"{cfg.memory_mb}m"]
        if cfg.max_procs is not None:
            argv += ["--pids-limit", str(cfg.max_procs)]
        argv += ["--workdir", cfg.workdir, "--entrypoint", "sh", cfg.image]
        argv += ["-c", f"mkdir -p {shlex.quote(cfg.workdir)} && exec sleep infinity"]
        return argv

    async def _cli(
        self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ProgramResult:
        return await run_process(
            argv,
            env=os.environ,  # the host's CLI (registry auth); the container gets only -e
            cwd=None,
            timeout=timeout,
            cap=self.config.output_cap_bytes,
            stdin=stdin,
        )

    async def start(self) -> None:
        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        try:
            result = await self._cli(self.run_argv(), timeout=600)
        except OSError as exc:
            raise RuntimeStartError(f"cannot run {self.config.cli}: {exc}") from exc
        if result.exit_code != 0:
            why = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
            raise RuntimeStartError(f"{self.config.cli} run failed: {why[:300]}")
        self.container = result.stdout.strip() or self.name

    def _exec_argv(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
        interactive: bool = False,
    ) -> list[str]:
        if self.container is None or self._stopped:
            raise RuntimeError("docker runtime is not started")
        out = [self.config.cli, "exec"]
        if interactive:
            out.append("-i")
        if cwd:
            out += ["-w", cwd if cwd.startswith("/") else f"{self.config.workdir}/{cwd}"]
        for key, value in {**self.config.env, **(env or {})}.items():
            out += ["-e", f"{key}={value}"]
        out.append(self.container)
        if timeout is not None:
            out += ["timeout", "-s", "KILL", str(timeout)]
        return out + list(argv)

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        client_timeout = None if timeout is None else timeout + CLIENT_GRACE_S
        result = await self._cli(self._exec_argv(argv, env, cwd, timeout), timeout=client_timeout)
        if timeout is not None and result.exit_code in (124, 137) and result.duration_s >= timeout:
            result.timed_out, result.exit_code = True, 124
        return result

    async def read(self, path: str) -> bytes:
        result = await self._cli(self._exec_argv(["cat", "--", path], None, None, None))
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path}: {result.stderr.strip()}")
        return result.stdout.encode()

    async def write(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        script = 'mkdir -p -- "$(dirname -- "$0")" && cat > "$0"'
        argv = self._exec_argv(["sh", "-c", script, path], None, None, None, interactive=True)
        result = await self._cli(argv, stdin=payload)
        if result.exit_code != 0:
            raise OSError(f"cannot write {path} in the container: {result.stderr.strip()}")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        # remove by name: a container whose `run -d` was interrupted still goes
        await self._cli([self.config.cli, "rm", "-f", self.name], timeout=120)


async def cleanup_containers(cli: str = "docker") -> list[str]:
    """Remove every container labelled by metrale (left by a killed run); returns their ids."""
    listing = await run_process(
        [cli, "ps", "-aq", "--filter", f"label={LABEL}"],
        env=os.environ,
        cwd=None,
        timeout=120,
        cap=1 << 20,
    )
    if listing.exit_code != 0:
        why = (listing.stderr.strip().splitlines() or ["no engine"])[-1]
        raise UsageError(f"'{cli} ps' failed: {why[:200]}")
    ids = listing.stdout.split()
    if ids:
        await run_process(
            [cli, "rm", "-f", *ids], env=os.environ, cwd=None, timeout=300, cap=1 << 20
        )
    return ids
