"""The installed plugins' entry points, read once per process.

`importlib.metadata.entry_points(group=...)` reads every installed distribution's metadata on
each call; benchmarks and runtimes are both plugins, and a run asks for both groups. One scan
serves them all. Nothing here imports a plugin.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from typing import cast


@cache
def group(name: str) -> tuple[EntryPoint, ...]:
    """The entry points of group `name`, the first installed distribution's first for each
    name (as pip resolves a shadowed one)."""
    seen: dict[str, EntryPoint] = {}
    for ep in _all().select(group=name):
        seen.setdefault(ep.name, ep)
    return tuple(seen.values())


@cache
def _all() -> EntryPoints:
    # Python 3.11 returns SelectableGroups, 3.12 EntryPoints: both `select` by group
    return cast(EntryPoints, entry_points())
