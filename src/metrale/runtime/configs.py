"""Runtime configs (pydantic, picked by `type`) and the two ways in: `runtime_config()` builds a
config from a runtime name and flat options (the CLI, the matrix sweep, benchmarks), and
`create_runtime()` / `runtime_factory()` turn a config into runtimes.

Each runtime is one config class that knows how to `create` its runtime (importing the
runtime's module only then, so `ray` stays an optional extra), how to `check` that this machine
can provide it, and which flat options it takes (`from_flat`); and one registration, its entry
in `CONFIGS`. Nothing else names a runtime.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, PrivateAttr, TypeAdapter, ValidationError

from metrale.bounds import (
    CPUS,
    FILE_SIZE_MB,
    MAX_PROCS,
    MEMORY_MB,
    TMPFS_MB,
    Bound,
    pydantic_range,
)
from metrale.errors import UsageError
from metrale.runtime.base import LIMIT_KEYS, Runtime, RuntimeConfig, Throttle, unknown_options
from metrale.runtime.procs import Limits, RateLimiter

logger = logging.getLogger(__name__)

#: Flat option names `runtime_config` accepts besides the config fields: limits, and binds.
_LIMIT_KEYS = LIMIT_KEYS
_BIND_KEYS = ("ro_binds", "rw_binds")
#: The docker runtime's image: built offline by `bash scripts/container-engine.sh up`.
DEFAULT_IMAGE = "metrale/base:bookworm"
ENGINE_UP = "bash scripts/container-engine.sh up"


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


class SubprocessConfig(RuntimeConfig):
    """Commands on the host in a fresh temp workdir: the cheapest runtime, and no isolation
    beyond a scrubbed environment, limits and process-group cleanup."""

    type: Literal["subprocess"] = "subprocess"
    #: RLIMIT_NPROC counts all of the host user's processes here, so it is off by default.
    limits: Limits = Field(default_factory=lambda: Limits(max_procs=None))
    env: dict[str, str] = Field(default_factory=dict)

    def create(self, throttle: Throttle | None = None) -> Runtime:
        from metrale.runtime.subprocess import SubprocessRuntime

        return SubprocessRuntime(self, throttle)

    def check(self) -> None:
        limited = any(v is not None for v in self.limits.model_dump().values())
        if limited and not shutil.which("prlimit"):
            raise UsageError("subprocess runtime: resource limits need 'prlimit' (util-linux)")


class BwrapConfig(RuntimeConfig):
    """A bubblewrap sandbox: read-only system dirs, a writable workdir, private sized /tmp and
    /dev/shm, new user/PID/IPC/UTS/network namespaces (loopback only unless `network`).

    `limits.memory_mb` is the sandbox's total memory (tmpfs included) where a memory cgroup can
    be made, else per process (RLIMIT_AS); `limits.max_procs` its process count (pids cgroup,
    else RLIMIT_NPROC)."""

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
        from metrale.runtime.bwrap import BwrapRuntime

        return BwrapRuntime(self, throttle)

    def check(self) -> None:
        from metrale.runtime.bwrap import check_bwrap

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


class DockerConfig(RuntimeConfig):
    """A container from any docker-compatible CLI, kept alive with `sleep infinity` under
    `--init`. The default image is the one scripts/container-engine.sh builds from Debian's
    packages (no registry needed); images are never pulled during a run."""

    type: Literal["docker"] = "docker"
    image: str = DEFAULT_IMAGE
    cli: str = "docker"
    network: str = Field(default="none", description="none (default), bridge, host, ...")
    cpus: float | None = Field(default=1.0, **pydantic_range(CPUS))
    memory_mb: int | None = Field(
        default=2048, description="RAM + swap of the container", **pydantic_range(MEMORY_MB)
    )
    max_procs: int | None = Field(
        default=256, description="--pids-limit", **pydantic_range(MAX_PROCS)
    )
    workdir: str = Field(default="/work", pattern="^/")
    env: dict[str, str] = Field(default_factory=dict)

    def create(self, throttle: Throttle | None = None) -> Runtime:
        from metrale.runtime.docker import DockerRuntime

        return DockerRuntime(self, throttle)

    def check(self) -> None:
        check_docker(self)

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`memory_mb` and `max_procs` are the container's own fields; other limits are not."""
        limits = [k for k in _LIMIT_KEYS if k in options and k not in cls.model_fields]
        if limits:
            unknown_options(cls, {k: options[k] for k in limits})
        return super().from_flat(options)

    @classmethod
    def flat_keys(cls) -> list[str]:
        return [k for k in cls.model_fields if k != "type"]


InnerConfig = Annotated[SubprocessConfig | BwrapConfig, Field(discriminator="type")]


class RayConfig(RuntimeConfig):
    """Each sandbox (`inner`) lives in a Ray actor on some cluster node."""

    type: Literal["ray"] = "ray"
    address: str = "auto"
    inner: InnerConfig = Field(default_factory=SubprocessConfig)
    actor_cpus: float = Field(
        default=0.01,
        description="CPU the actor reserves when placed",
        **pydantic_range(Bound(0, 4096, unit="CPUs")),
    )
    spread: bool = Field(default=True, description="SPREAD scheduling across nodes")

    def create(self, throttle: Throttle | None = None) -> Runtime:
        from metrale.runtime.ray import RayRuntime

        return RayRuntime(self, throttle, make_inner=runtime_from_dict)

    def check(self) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError(
                "the ray runtime needs the ray extra: pip install 'metrale[ray]'"
            ) from None
        _check_ray_address(self.address)
        self.inner.check()

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`inner="bwrap"` picks the sandbox; every option the ray config does not have goes
        to it (the inner sandbox is also what caps a command's output)."""
        own = {k: options.pop(k) for k in list(options) if k in cls.model_fields}
        if "output_cap_bytes" in own:
            options["output_cap_bytes"] = own["output_cap_bytes"]
        inner = own.pop("inner", "subprocess")
        if isinstance(inner, str):
            if inner not in ("subprocess", "bwrap"):
                raise UsageError(
                    f"unknown ray inner runtime {inner!r}; accepted: subprocess, bwrap"
                )
            own["inner"] = runtime_config(inner, **options)
        else:
            if options:
                unknown_options(cls, options)
            own["inner"] = inner
        return own


class ModalConfig(RuntimeConfig):
    """A Modal sandbox per rollout, through the official SDK (extra `metrale[modal]`); the
    credentials are the SDK's own (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET or its config file)."""

    type: Literal["modal"] = "modal"
    image: str = Field(
        default="debian:bookworm-slim", description="registry image (Image.from_registry)"
    )
    dockerfile: str | None = Field(
        default=None, description="a Dockerfile to build the image from (Image.from_dockerfile)"
    )
    app: str = Field(default="metrale", description="app name prefix: one app <app>-<run> a run")
    cpu: float | None = Field(default=1.0, description="CPU cores reserved", **pydantic_range(CPUS))
    memory_mb: int | None = Field(
        default=2048, description="memory reserved (MiB)", **pydantic_range(MEMORY_MB)
    )
    timeout_s: int = Field(
        default=3600,
        description="the sandbox's lifetime: the service terminates it after this",
        **pydantic_range(Bound(10, 86400, integer=True, unit="s")),
    )
    start_timeout_s: float = Field(
        default=300.0,
        description="a sandbox not running this long after its creation is a runtime_start "
        "error, and is terminated",
        **pydantic_range(Bound(1, 3600, unit="s")),
    )
    create_retries: int = Field(
        default=12,
        description="retries (exponential backoff) of a creation refused for a rate limit or "
        "quota (RESOURCE_EXHAUSTED), each counted as a runtime retry",
        **pydantic_range(Bound(0, 1000, integer=True, unit="retries")),
    )
    network: bool = Field(default=False, description="outbound network (off: block_network)")
    workdir: str = Field(default="/work", pattern="^/", description="the sandbox's workdir")
    env: dict[str, str] = Field(default_factory=dict, description="the sandbox's environment")
    _run_id: str = PrivateAttr(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def run_id(self) -> str:
        """This run's id (one config object per run): its app and every sandbox's tag."""
        return self._run_id

    def app_name(self) -> str:
        return f"{self.app}-{self.run_id}"

    def create(self, throttle: Throttle | None = None) -> Runtime:
        from metrale.runtime.modal import ModalRuntime

        return ModalRuntime(self, throttle)

    def check(self) -> None:
        from metrale.runtime.modal import check_modal

        check_modal(self)

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`memory_mb` is the sandbox's own field; other limits are not."""
        limits = [k for k in _LIMIT_KEYS if k in options and k not in cls.model_fields]
        if limits:
            unknown_options(cls, {k: options[k] for k in limits})
        return super().from_flat(options)

    @classmethod
    def flat_keys(cls) -> list[str]:
        return [k for k in cls.model_fields if k != "type"]


#: The registered runtimes: adding one is its config class and its entry here.
CONFIGS: tuple[type[RuntimeConfig], ...] = (
    SubprocessConfig,
    BwrapConfig,
    DockerConfig,
    RayConfig,
    ModalConfig,
)
RUNTIMES: tuple[str, ...] = tuple(c.model_fields["type"].default for c in CONFIGS)
_BY_NAME: dict[str, type[RuntimeConfig]] = dict(zip(RUNTIMES, CONFIGS, strict=True))
# the union of whatever CONFIGS holds: pydantic reads it at run time, mypy cannot
AnyRuntimeConfig = Annotated[Union[CONFIGS], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
_ANY: TypeAdapter[Any] = TypeAdapter(AnyRuntimeConfig)


def parse_runtime_config(data: Mapping[str, Any]) -> RuntimeConfig:
    """A config from its JSON form (as in run.json), picked by its `type`."""
    try:
        config: RuntimeConfig = _ANY.validate_python(dict(data))
        return config
    except ValidationError as exc:
        raise UsageError(f"bad runtime config: {_first_error(exc)}") from None


def runtime_config(name: str, **options: Any) -> RuntimeConfig:
    """The config of runtime `name` with `options`, e.g.
    `runtime_config("bwrap", ro_binds=["/root/.cargo"], rw_binds=["/tmp/t:/work/target"])`.

    Besides each config's own fields, flat limit options (`cpu_s`, `memory_mb`, `max_procs`,
    `file_size_mb`) are accepted, and what each config's `from_flat` adds. Unknown runtimes or
    options raise `UsageError` naming what is accepted.
    """
    cls = _BY_NAME.get(name)
    if cls is None:
        raise UsageError(f"unknown runtime {name!r}; accepted: {', '.join(RUNTIMES)}")
    fields = cls.from_flat({k: v for k, v in options.items() if v is not None})
    return _build(cls, name, fields)


def _build(cls: type[RuntimeConfig], name: str, fields: dict[str, Any]) -> RuntimeConfig:
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise UsageError(f"bad {name} runtime option: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def create_runtime(config: RuntimeConfig, *, throttle: RateLimiter | None = None) -> Runtime:
    """A new, not yet started runtime for `config` (one per rollout)."""
    if type(config) is RuntimeConfig:  # read back from JSON without its class: pick by type
        config = parse_runtime_config(config.model_dump())
    return config.create(throttle)


def runtime_from_dict(data: dict[str, Any]) -> Runtime:
    """A runtime from its config read back as a dict (the ray actor's inner sandbox)."""
    return create_runtime(parse_runtime_config(data))


def runtime_factory(
    config: RuntimeConfig,
    adjust: Callable[[RuntimeConfig, int], RuntimeConfig] | None = None,
) -> Callable[[int], Runtime]:
    """`make_runtime` for a `RolloutPlan`: rollout `index` gets a runtime for `config` (or for
    `adjust(config, index)`, e.g. its own binds). Every runtime it makes shares one creation
    throttle (`config.start_rate` starts per second), so the limit holds across the whole run."""
    throttle = RateLimiter(config.start_rate) if config.start_rate else None
    if adjust is None:
        return lambda index: create_runtime(config, throttle=throttle)
    return lambda index: create_runtime(adjust(config, index), throttle=throttle)


def _check_ray_address(address: str) -> None:
    """A cluster that is not there is a usage error now, before any rollout: `ray.init` would
    retry a HOST:PORT for minutes, and with `auto` every rollout would fail to start. `auto`
    is resolved as Ray does (RAY_ADDRESS, then the last `ray start` on this machine, then a
    running GCS process); `local` starts a private cluster and needs nothing."""
    if address == "auto":
        address = _resolve_ray_auto()
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # local, ray://...: ray itself fails fast or starts one
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise UsageError(f"ray runtime: nothing answers at {address} ({exc})") from None


def _resolve_ray_auto() -> str:
    try:
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address("auto")
    except Exception as exc:  # ConnectionError when none; ray's private API may also move
        if not isinstance(exc, ConnectionError):
            logger.debug("cannot look for a running ray cluster here (%r): ray.init decides", exc)
            return "auto"  # cannot tell here: let ray.init decide
        found = None
    if not found:
        raise UsageError(
            "ray runtime: --ray-address auto found no running Ray cluster; accepted: start one "
            "('ray start --head'), give HOST:PORT, or --ray-address local for a private one"
        )
    return str(found)


def check_runtime(config: RuntimeConfig) -> None:
    """Fail fast, before any rollout, when this machine cannot provide the runtime at all
    (bwrap missing or user namespaces off, no docker engine, ray not installed): UsageError.

    A config that passed is not checked again while it is unchanged: the CLI, the benchmark and
    the rollout engine each make sure of the runtime before their work, and a docker check
    probes the engine (a process and a round trip each time)."""
    checked_as = config.model_dump_json()
    if config.checked_as == checked_as:
        return
    concrete = config
    if type(config) is RuntimeConfig:  # read back from JSON without its class
        concrete = parse_runtime_config(config.model_dump())
    concrete.check()
    config.checked_as = concrete.checked_as = checked_as


def _engine_probe(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        raise UsageError(f"docker runtime: '{what}' did not answer in 30 s") from None
    except OSError as exc:
        raise UsageError(f"docker runtime: cannot run {argv[0]!r}: {exc}") from None


def check_docker(config: DockerConfig) -> None:
    """The CLI exists, an engine answers it, and the image is there (never pulled mid-run:
    64 rollouts would pull it 64 times, timed as setup). Each failure names the fix."""
    cli = config.cli
    if shutil.which(cli) is None:
        raise UsageError(
            f"docker runtime: {cli!r} is not on PATH (pick one with --docker-cli); "
            f"to install and start an engine: {ENGINE_UP}"
        )
    probe = _engine_probe([cli, "version", "--format", "{{.Server.Version}}"], f"{cli} version")
    if probe.returncode != 0 or not probe.stdout.strip():
        where = os.environ.get("DOCKER_HOST", "the default socket")
        why = (probe.stderr.strip().splitlines() or ["no engine"])[-1][:200]
        raise UsageError(
            f"docker runtime: no container engine answers {cli!r} at {where} ({why}); "
            f'start one with: eval "$({ENGINE_UP})"'
        )
    image = _engine_probe([cli, "image", "inspect", config.image], f"{cli} image inspect")
    if image.returncode != 0:
        hint = (
            f"build it with: {ENGINE_UP}"
            if config.image == DEFAULT_IMAGE
            else f"'{cli} pull {config.image}' or build it first"
        )
        raise UsageError(f"docker runtime: image {config.image!r} is not in the engine; {hint}")
