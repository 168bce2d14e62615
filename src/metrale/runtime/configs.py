"""Runtime configs (pydantic, picked by `type`) and the two ways in: `runtime_config()` builds a
config from a runtime name and flat options (the CLI, the matrix sweep, benchmarks), and
`create_runtime()` / `runtime_factory()` turn a config into runtimes. Runtime modules are
imported only when a runtime of their kind is created, so `ray` stays an optional extra.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from metrale.errors import UsageError
from metrale.runtime.base import Runtime, RuntimeConfig
from metrale.runtime.procs import Limits, RateLimiter

RUNTIMES: tuple[str, ...] = ("subprocess", "bwrap", "docker", "ray")
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

    type: Literal["subprocess"] = "subprocess"  # type: ignore[assignment]
    #: RLIMIT_NPROC counts all of the host user's processes here, so it is off by default.
    limits: Limits = Field(default_factory=lambda: Limits(max_procs=None))
    env: dict[str, str] = Field(default_factory=dict)


class BwrapConfig(RuntimeConfig):
    """A bubblewrap sandbox: read-only system dirs, a writable workdir, private sized /tmp and
    /dev/shm, new user/PID/IPC/UTS/network namespaces (loopback only unless `network`).

    `limits.memory_mb` is the sandbox's total memory (tmpfs included) where a memory cgroup can
    be made, else per process (RLIMIT_AS); `limits.max_procs` its process count (pids cgroup,
    else RLIMIT_NPROC)."""

    type: Literal["bwrap"] = "bwrap"  # type: ignore[assignment]
    limits: Limits = Field(default_factory=Limits)
    binds: list[Bind] = Field(default_factory=list)
    network: bool = False
    workdir: str = Field(default="/work", description="the workdir's path inside the sandbox")
    env: dict[str, str] = Field(default_factory=dict)
    tmp_mb: int | None = Field(default=512, ge=1, description="size of the sandbox's /tmp")
    shm_mb: int | None = Field(default=64, ge=1, description="size of the sandbox's /dev/shm")


class DockerConfig(RuntimeConfig):
    """A container from any docker-compatible CLI, kept alive with `sleep infinity` under
    `--init`. The default image is the one scripts/container-engine.sh builds from Debian's
    packages (no registry needed); images are never pulled during a run."""

    type: Literal["docker"] = "docker"  # type: ignore[assignment]
    image: str = DEFAULT_IMAGE
    cli: str = "docker"
    network: str = Field(default="none", description="none (default), bridge, host, ...")
    cpus: float | None = Field(default=1.0, gt=0)
    memory_mb: int | None = Field(default=2048, gt=0, description="RAM + swap of the container")
    max_procs: int | None = Field(default=256, gt=0, description="--pids-limit")
    workdir: str = Field(default="/work", pattern="^/")
    env: dict[str, str] = Field(default_factory=dict)


InnerConfig = Annotated[SubprocessConfig | BwrapConfig, Field(discriminator="type")]


class RayConfig(RuntimeConfig):
    """Each sandbox (`inner`) lives in a Ray actor on some cluster node."""

    type: Literal["ray"] = "ray"  # type: ignore[assignment]
    address: str = "auto"
    inner: InnerConfig = Field(default_factory=SubprocessConfig)
    actor_cpus: float = Field(default=0.01, description="CPU the actor reserves when placed")
    spread: bool = Field(default=True, description="SPREAD scheduling across nodes")


AnyRuntimeConfig = Annotated[
    SubprocessConfig | BwrapConfig | DockerConfig | RayConfig, Field(discriminator="type")
]
_ANY = TypeAdapter(AnyRuntimeConfig)

#: Flat option names accepted by `runtime_config` besides the config fields themselves.
_LIMIT_KEYS = ("cpu_s", "memory_mb", "max_procs", "file_size_mb")
_BIND_KEYS = ("ro_binds", "rw_binds")


def parse_runtime_config(data: Mapping[str, Any]) -> RuntimeConfig:
    """A config from its JSON form (as in run.json), picked by its `type`."""
    try:
        return _ANY.validate_python(dict(data))
    except ValidationError as exc:
        raise UsageError(f"bad runtime config: {_first_error(exc)}") from None


def runtime_config(name: str, **options: Any) -> RuntimeConfig:
    """The config of runtime `name` with `options`, e.g.
    `runtime_config("bwrap", ro_binds=["/root/.cargo"], rw_binds=["/tmp/t:/work/target"])`.

    Besides each config's own fields, flat limit options (`cpu_s`, `memory_mb`, `max_procs`,
    `file_size_mb`) and `ro_binds` / `rw_binds` (`SRC` or `SRC:DST` strings) are accepted; for
    `ray`, `inner="bwrap"` picks the sandbox and every option the ray config does not have
    goes to it. Unknown runtimes or options raise `UsageError` naming what is accepted.
    """
    if name not in RUNTIMES:
        raise UsageError(f"unknown runtime {name!r}; accepted: {', '.join(RUNTIMES)}")
    options = {k: v for k, v in options.items() if v is not None}
    if name == "ray":
        own = {k: options.pop(k) for k in list(options) if k in RayConfig.model_fields}
        if "output_cap_bytes" in own:  # the inner sandbox is what caps a command's output
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
                _unknown("ray", options, RayConfig)
            own["inner"] = inner
        return _build(RayConfig, "ray", own)
    cls: type[RuntimeConfig] = {
        "subprocess": SubprocessConfig,
        "bwrap": BwrapConfig,
        "docker": DockerConfig,
    }[name]
    fields: dict[str, Any] = {}
    limits = {k: options.pop(k) for k in _LIMIT_KEYS if k in options}
    binds = {k: options.pop(k) for k in _BIND_KEYS if k in options}
    if limits:
        if "limits" in cls.model_fields:
            base = cls.model_fields["limits"].get_default(call_default_factory=True)
            fields["limits"] = {**base.model_dump(), **limits}
        elif name == "docker":
            for key in ("memory_mb", "max_procs"):
                if key in limits:
                    fields[key] = limits.pop(key)
            if limits:
                _unknown(name, limits, cls)
    if binds:
        if name != "bwrap":
            _unknown(name, binds, cls)
        parsed = list(options.pop("binds", []))
        parsed += [Bind.parse(b, writable=False) for b in binds.get("ro_binds", [])]
        parsed += [Bind.parse(b, writable=True) for b in binds.get("rw_binds", [])]
        fields["binds"] = parsed
    unknown = {k: v for k, v in options.items() if k not in cls.model_fields or k == "type"}
    if unknown:
        _unknown(name, unknown, cls)
    fields.update(options)
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


def _unknown(name: str, options: Mapping[str, Any], cls: type[BaseModel]) -> None:
    accepted = [k for k in cls.model_fields if k != "type"]
    if "limits" in cls.model_fields:
        accepted += _LIMIT_KEYS
    if cls is BwrapConfig:
        accepted += _BIND_KEYS
    if cls is DockerConfig:
        accepted = [k for k in accepted if k not in _LIMIT_KEYS or k in DockerConfig.model_fields]
    raise UsageError(
        f"option(s) {', '.join(sorted(options))} do not apply to the {name} runtime; "
        f"accepted: {', '.join(accepted)}"
    )


def create_runtime(config: RuntimeConfig, *, throttle: RateLimiter | None = None) -> Runtime:
    """A new, not yet started runtime for `config` (one per rollout)."""
    if isinstance(config, SubprocessConfig):
        from metrale.runtime.subprocess import SubprocessRuntime

        return SubprocessRuntime(config, throttle)
    if isinstance(config, BwrapConfig):
        from metrale.runtime.bwrap import BwrapRuntime

        return BwrapRuntime(config, throttle)
    if isinstance(config, DockerConfig):
        from metrale.runtime.docker import DockerRuntime

        return DockerRuntime(config, throttle)
    if isinstance(config, RayConfig):
        from metrale.runtime.ray import RayRuntime

        return RayRuntime(config, throttle)
    # a plain RuntimeConfig (e.g. read back from JSON): pick by its type
    if type(config) is RuntimeConfig or config.type in RUNTIMES:
        return create_runtime(parse_runtime_config(config.model_dump()), throttle=throttle)
    raise UsageError(f"unknown runtime {config.type!r}; accepted: {', '.join(RUNTIMES)}")


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
    (bwrap missing or user namespaces off, no docker engine, ray not installed): UsageError."""
    if isinstance(config, RayConfig):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError(
                "the ray runtime needs the ray extra: pip install 'metrale[ray]'"
            ) from None
        _check_ray_address(config.address)
        check_runtime(config.inner)
    elif isinstance(config, BwrapConfig):
        from metrale.runtime.bwrap import check_bwrap

        check_bwrap(config)
    elif isinstance(config, DockerConfig):
        check_docker(config)
    elif (
        isinstance(config, SubprocessConfig)
        and any(v is not None for v in config.limits.model_dump().values())
        and not shutil.which("prlimit")
    ):
        raise UsageError("subprocess runtime: resource limits need 'prlimit' (util-linux)")


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
