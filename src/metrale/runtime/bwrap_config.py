"""The bwrap runtime's config: what a user may set (binds, network, sizes, an image root, a
seed), how it is read from flat options, and how it is fitted to a task. The runtime it
creates is `bwrap_runtime.BwrapRuntime`, imported only when one is made or checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field

from metrale.bounds import FILE_SIZE_MB, TMPFS_MB, pydantic_range
from metrale.errors import UsageError
from metrale.runtime.base import (
    Capability,
    CleanupReport,
    Runtime,
    RuntimeConfig,
    TaskSandbox,
    Throttle,
)
from metrale.runtime.procs import Limits

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
        from metrale.runtime.bwrap_runtime import BwrapRuntime

        return BwrapRuntime(self, throttle)

    def check(self) -> None:
        from metrale.runtime.bwrap_runtime import check_bwrap

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
