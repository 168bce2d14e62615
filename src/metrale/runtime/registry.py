"""The installed runtimes: the `metrale.runtimes` entry-point group, read without importing.

A runtime is one module holding its config class and its runtime class; the entry point names
the config class (`prime = "metrale.runtime.prime:PrimeConfig"`). metrale's own four are
registered the same way as a runtime from another package, so nothing here names a runtime.
A name is read from the package metadata (no import); a config class is loaded only when a
run asks for that runtime, or when every one is needed (the flags' help, `metrale cleanup`).
"""

from __future__ import annotations

import logging
from functools import cache
from importlib.metadata import EntryPoint

from metrale.entry import group
from metrale.errors import UsageError
from metrale.runtime.base import RuntimeConfig

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "metrale.runtimes"


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in group(ENTRY_POINT_GROUP)}


def runtime_names() -> tuple[str, ...]:
    """Every installed runtime's name, sorted (the metadata's order depends on how the package
    was installed), none of them imported."""
    return tuple(sorted(_entry_points()))


def config_class(name: str) -> type[RuntimeConfig]:
    """The config class of runtime `name` (its module imported now). Unknown, or a plugin that
    cannot be loaded: UsageError naming what is accepted or what failed."""
    ep = _entry_points().get(name)
    if ep is None:
        accepted = ", ".join(runtime_names()) or "(none installed)"
        raise UsageError(f"unknown runtime {name!r}; accepted: {accepted}")
    return _load(ep)


@cache
def _load(ep: EntryPoint) -> type[RuntimeConfig]:
    try:
        loaded = ep.load()
    except Exception as exc:  # a broken plugin is the installer's mistake, named in one line
        raise UsageError(
            f"runtime plugin {ep.name!r} ({ep.value}) cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    declared = getattr(loaded, "model_fields", {}).get("type")
    if not (isinstance(loaded, type) and issubclass(loaded, RuntimeConfig)) or declared is None:
        raise UsageError(f"runtime plugin {ep.name!r} ({ep.value}) is not a RuntimeConfig subclass")
    if declared.default != ep.name:
        raise UsageError(
            f"runtime plugin {ep.name!r} ({ep.value}) declares type {declared.default!r}; "
            "the entry point's name and the config's `type` must be the same"
        )
    return loaded


def config_classes() -> dict[str, type[RuntimeConfig]]:
    """Every installed runtime's config class. A plugin that cannot be loaded is left out (and
    logged at debug level, `-vv`): one broken package must not take `--help` or any run that
    does not ask for it down with it; asking for it by name says what is wrong."""
    classes: dict[str, type[RuntimeConfig]] = {}
    for name in runtime_names():
        ep = _entry_points()[name]
        try:
            classes[name] = _load(ep)
        except UsageError as exc:
            logger.debug("%s", exc)
    return classes
