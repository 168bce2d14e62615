"""The ways into the installed runtimes: `runtime_config()` builds a config from a runtime
name and flat options (the CLI, the matrix sweep, benchmarks), `parse_runtime_config()` reads
one back from JSON, and `create_runtime()` / `runtime_factory()` turn a config into runtimes.

Nothing here names a runtime. Each is a plugin (`metrale.runtime.registry`): its module holds
its config class, which knows how to `create` its runtime, how to `check` that this machine can
provide it and which flat options it takes (`from_flat`). The four of metrale's own config
classes are re-exported here by name, loaded on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from metrale.errors import UsageError
from metrale.runtime.base import Runtime, RuntimeConfig
from metrale.runtime.procs import RateLimiter
from metrale.runtime.registry import config_class, runtime_names

if TYPE_CHECKING:
    pass

#: names kept importable from here, and the module each lives in
_MOVED = {
    **dict.fromkeys(["Bind", "BwrapConfig"], "metrale.runtime.bwrap"),
    **dict.fromkeys(
        ["DEFAULT_IMAGE", "ENGINE_UP", "DockerConfig", "check_docker"], "metrale.runtime.docker"
    ),
    "RayConfig": "metrale.runtime.ray",
    "SubprocessConfig": "metrale.runtime.subprocess",
}


def parse_runtime_config(data: Mapping[str, Any]) -> RuntimeConfig:
    """A config from its JSON form (as in run.json), picked by its `type` among the installed
    runtimes (`metrale.runtime.registry`)."""
    name = data.get("type")
    if not isinstance(name, str):
        raise UsageError(f"bad runtime config: no runtime type in {dict(data)!r:.200}")
    cls = config_class(name)
    try:
        return cls.model_validate(dict(data))
    except ValidationError as exc:
        raise UsageError(f"bad runtime config: {_first_error(exc)}") from None


def runtime_config(name: str, **options: Any) -> RuntimeConfig:
    """The config of runtime `name` with `options`, e.g.
    `runtime_config("bwrap", ro_binds=["/root/.cargo"], rw_binds=["/tmp/t:/work/target"])`.

    Besides each config's own fields, flat limit options (`cpu_s`, `memory_mb`, `max_procs`,
    `file_size_mb`) are accepted, and what each config's `from_flat` adds. Unknown runtimes or
    options raise `UsageError` naming what is accepted.
    """
    cls = config_class(name)
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


def __getattr__(name: str) -> Any:
    if name == "RUNTIMES":  # the installed runtimes, read when asked (plugins may add some)
        return runtime_names()
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
