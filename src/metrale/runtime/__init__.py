"""Where a rollout's commands run: the `Runtime` protocol and its implementations.

The configs (pydantic models of every runtime, ~15 ms to build) load on first use, not with
the package: a run without `--runtime` imports `metrale.runtime.base` and never needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from metrale.runtime.base import ProgramResult, Runtime, RuntimeConfig, RuntimeStartError

if TYPE_CHECKING:
    from metrale.runtime.configs import (
        RUNTIMES,
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

_LAZY = {
    **dict.fromkeys(
        ["RUNTIMES", "Bind", "BwrapConfig", "DockerConfig", "RayConfig",
         "SubprocessConfig", "check_runtime", "create_runtime", "parse_runtime_config",
         "runtime_config", "runtime_factory"],
        "metrale.runtime.configs",
    ),
    "Limits": "metrale.runtime.procs",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'metrale.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "RUNTIMES",
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
