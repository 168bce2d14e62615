"""The runtime contract: provision a sandbox, run commands in it, move files, tear it down.

`start()` is timed as the rollout's setup stage. `stop()` is idempotent and must leave no
process behind. Expected failures of a command (non-zero exit, timeout) are data in
`ProgramResult`; a sandbox that cannot be provisioned raises `RuntimeStartError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, NoReturn, Protocol, Self, runtime_checkable

from pydantic import BaseModel, Field, PrivateAttr

from metrale.bounds import BYTES, COUNT, RATE_PER_S, pydantic_range
from metrale.errors import UsageError

#: Flat resource-limit options every runtime config with a `limits` field accepts.
LIMIT_KEYS: tuple[str, ...] = ("cpu_s", "memory_mb", "max_procs", "file_size_mb")


class RuntimeStartError(Exception):
    """The sandbox could not be provisioned (retried by `--retries-runtime`)."""

    kind = "runtime_start"


class SandboxLostError(RuntimeError):
    """The sandbox died under its rollout (e.g. `kill -9 -1` inside): no later command may run,
    since there is nothing left to run it in. Recorded on the rollout as `runtime_lost`."""

    kind = "runtime_lost"


class ProgramResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    stdout_dropped: int = 0
    stderr_dropped: int = 0


class RuntimeConfig(BaseModel):
    """Base of every runtime's config; concrete configs set `type` to a literal."""

    type: str
    output_cap_bytes: int = Field(default=1 << 20, **pydantic_range(BYTES))
    start_rate: float | None = Field(default=None, **pydantic_range(RATE_PER_S))
    """Sandbox creations per second across one run (None: unthrottled); waiting counts as setup."""
    start_limit: int | None = Field(default=None, **pydantic_range(COUNT))
    """Sandbox starts in flight at once (None: adaptive to the start latency, from twice the
    cores; 0: no bound); waiting for a slot is the rollout's `setup_wait`, part of setup."""
    pool: int = Field(default=0, **pydantic_range(COUNT))
    """Sandboxes started ahead of the rollouts that will use them, one each, never reused
    (0: none); the pool's start is the rollout's `pool_start`, not part of its setup."""
    #: the config (as JSON) that last passed `check_runtime`, in this process: not saved
    _checked_as: str | None = PrivateAttr(default=None)

    @property
    def checked_as(self) -> str | None:
        return self._checked_as

    @checked_as.setter
    def checked_as(self, value: str | None) -> None:
        self._checked_as = value

    def create(self, throttle: Throttle | None = None) -> Runtime:
        """A new, not yet started runtime of this config (its module imported only now)."""
        raise UsageError(f"runtime {self.type!r} cannot be created from a bare config")

    def check(self) -> None:
        """Raise UsageError when this machine cannot provide the runtime at all."""

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The config's fields from flat options (the CLI's, a sweep file's): its own fields,
        and the `LIMIT_KEYS` folded into `limits` where it has one. Unknown: UsageError."""
        fields: dict[str, Any] = {}
        limits = {
            k: options.pop(k) for k in LIMIT_KEYS if k in options and k not in cls.model_fields
        }
        if limits:
            if "limits" not in cls.model_fields:
                unknown_options(cls, limits)
            base = cls.model_fields["limits"].get_default(call_default_factory=True)
            fields["limits"] = {**base.model_dump(), **limits}
        unknown = {k: v for k, v in options.items() if k not in cls.model_fields or k == "type"}
        if unknown:
            unknown_options(cls, unknown)
        fields.update(options)
        return fields

    @classmethod
    def flat_keys(cls) -> list[str]:
        """Every flat option `from_flat` accepts, for the error that lists them."""
        keys = [k for k in cls.model_fields if k != "type"]
        return [*keys, *LIMIT_KEYS] if "limits" in cls.model_fields else keys


def unknown_options(cls: type[RuntimeConfig], options: Mapping[str, Any]) -> NoReturn:
    name = cls.model_fields["type"].default
    raise UsageError(
        f"option(s) {', '.join(sorted(options))} do not apply to the {name} runtime; "
        f"accepted: {', '.join(cls.flat_keys())}"
    )


@runtime_checkable
class Runtime(Protocol):
    @property
    def config(self) -> RuntimeConfig: ...  # read-only: each runtime holds its own config type

    async def start(self) -> None: ...

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult: ...

    async def read(self, path: str) -> bytes: ...

    async def write(self, path: str, data: bytes | str) -> None: ...

    async def kill_commands(self) -> None:
        """Kill every process any command started (daemons, `setsid` children included); the
        sandbox and its files stay. Scoring calls it between the agent and the verifier, so
        nothing the agent left running can rewrite what the verifier writes."""
        ...

    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class RuntimeBase:
    """What every runtime shares: the async context manager, and awaiting the run's creation
    throttle (if any) at the top of `start()` so the wait is part of the measured setup."""

    config: RuntimeConfig

    def __init__(self, config: RuntimeConfig, throttle: Throttle | None = None) -> None:
        self.config = config
        self._throttle = throttle

    async def _await_throttle(self) -> None:
        if self._throttle is not None:
            await self._throttle.acquire()

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        """Run `command` in the sandbox: a string is a shell command line (`sh -c`), a
        sequence the argv itself. Written once here; each runtime runs the argv
        (`execute`)."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return await self.execute(argv, env=env, cwd=cwd, timeout=timeout)

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        """`argv` in the sandbox with `env` added, in `cwd` (the workdir when None), killed
        after `timeout` seconds (a result with `timed_out`, never an exception)."""
        raise NotImplementedError

    async def kill_commands(self) -> None:
        raise NotImplementedError(f"the {self.config.type} runtime cannot kill its commands")

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class Throttle(Protocol):
    async def acquire(self) -> None: ...
