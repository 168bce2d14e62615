"""Where a rollout's commands run: the `Runtime` protocol and its implementations."""

from metrale.runtime.base import ProgramResult, Runtime, RuntimeConfig, RuntimeStartError
from metrale.runtime.configs import (
    RUNTIMES,
    AnyRuntimeConfig,
    Bind,
    BwrapConfig,
    DockerConfig,
    RayConfig,
    SubprocessConfig,
    check_runtime,
    create_runtime,
    parse_runtime_config,
    runtime_config,
    runtime_factory,
)
from metrale.runtime.procs import Limits

__all__ = [
    "RUNTIMES",
    "AnyRuntimeConfig",
    "Bind",
    "BwrapConfig",
    "DockerConfig",
    "Limits",
    "ProgramResult",
    "RayConfig",
    "Runtime",
    "RuntimeConfig",
    "RuntimeStartError",
    "SubprocessConfig",
    "check_runtime",
    "create_runtime",
    "parse_runtime_config",
    "runtime_config",
    "runtime_factory",
]
