"""The runtime contract: provision a sandbox, run commands in it, move files, tear it down.

`start()` is timed as the rollout's setup stage. `stop()` is idempotent and must leave no
process behind. Expected failures of a command (non-zero exit, timeout) are data in
`ProgramResult`; a sandbox that cannot be provisioned raises `RuntimeStartError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, ClassVar, NoReturn, Protocol, Self, runtime_checkable

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


class Capability(StrEnum):
    """What a runtime can provide. Benchmarks ask for capabilities, never for runtime names, so
    a runtime from another package serves every benchmark whose needs it declares."""

    TASK_IMAGE = "task_image"
    """runs a task's own container image (its file system, root inside it)"""
    HOST_PATHS = "host_paths"
    """shows chosen host paths inside the sandbox (a toolchain, a warm cache)"""
    NETWORK_OFF = "network_off"
    """a sandbox can be cut off from every network"""
    NETWORK = "network"
    """a sandbox can be given a network beyond its own loopback (a task's `allow_internet`)"""
    BOUNDS = "bounds"
    """per-sandbox memory and process bounds"""
    REMOTE = "remote"
    """sandboxes live on a remote service (they cost money and outlive a killed run)"""
    LEFTOVERS = "leftovers"
    """finds what dead runs left (`metrale cleanup`)"""
    KILL_COMMANDS = "kill_commands"
    """kills every process its commands started while the sandbox stays"""


@dataclass(frozen=True)
class TaskSandbox:
    """What a task asks of the sandboxes its rollouts run in (terminal_bench: its task.toml and
    its built image), for a runtime with `Capability.TASK_IMAGE` to fold into its config
    (`RuntimeConfig.for_task`). The benchmark never needs to know which runtime it has."""

    #: the task image's tag in the local engine (None: the build failed or is not done)
    image: str | None = None
    #: the image's exported root directory, for runtimes whose `image_form()` is "rootfs"
    rootfs: str | None = None
    #: the image's build context (its Dockerfile's directory), for runtimes that build remotely
    context: str | None = None
    #: where the agent starts (the image's WORKDIR, or task.toml's), None: the runtime's own
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    #: the task allows the internet: the network the runtime gives (`Capability.NETWORK`); else
    #: none at all (`Capability.NETWORK_OFF`): exactly as the task says, whatever the flags
    internet: bool = False
    #: absolute paths that must be writable besides the workdir (runtimes over a read-only root)
    scratch: tuple[str, ...] = ()


@dataclass
class CleanupReport:
    """What `metrale cleanup` removed, kept and noted, across every runtime's `cleanup`."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"removed {item}" for item in self.removed]
        out += [f"kept {item}" for item in self.kept]
        out += self.notes
        if not self.removed:
            out.append("nothing to remove")
        return out


class ProgramResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    stdout_dropped: int = 0
    stderr_dropped: int = 0


class RuntimeConfig(BaseModel):
    """Base of every runtime's config; concrete configs set `type` to a literal.

    A runtime is a plugin: one module holding its config (this class's subclass) and its
    runtime, registered under the `metrale.runtimes` entry-point group (`name =
    "module:ConfigClass"`). The config says what the runtime can do (`capabilities`), creates it
    (`create`), checks this machine can provide it (`check`) and removes what dead runs left
    (`cleanup`). Every field with a `description` becomes a `--<name>-<field>` flag unless a
    shared runtime flag already sets it."""

    #: what this runtime provides (see `Capability`); benchmarks ask for these
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
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

    def image_form(self) -> str | None:
        """How this runtime takes a task's image: "tag" (the local engine's tag, or a registry
        name a service resolves), "rootfs" (an exported root directory), None: it cannot."""
        return None

    def for_task(self, task: TaskSandbox) -> RuntimeConfig:
        """This config adjusted for a task's sandbox (its image, WORKDIR, ENV, bounds, network);
        only runtimes with `Capability.TASK_IMAGE` override it."""
        raise UsageError(f"the {self.type} runtime cannot run a task's container image")

    def with_paths(
        self, read_only: Sequence[str], writable: Mapping[str, str]
    ) -> tuple[RuntimeConfig, dict[str, str]]:
        """This config showing host paths inside (`Capability.HOST_PATHS`): each of `read_only`
        at its own path, each host path of `writable` writable, where the runtime can at the
        inside path asked for. Returns the config and where each writable path is inside."""
        raise UsageError(f"the {self.type} runtime cannot show host paths inside its sandboxes")

    def cleanup(self, report: CleanupReport, *, everything: bool = False) -> None:
        """Remove what dead runs of this runtime left (sandboxes, dirs, cgroups), never what a
        live run uses (`everything`: also live runs' and other hosts'); report each."""

    def lacks(self, needs: frozenset[Capability]) -> frozenset[Capability]:
        """The capabilities of `needs` this runtime lacks (empty: it serves them all)."""
        return needs - self.capabilities

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
