"""`metrale cleanup`: remove what killed runs left, and nothing a live run uses.

Each installed runtime that leaves anything behind (`Capability.LEFTOVERS`) finds its own
(`RuntimeConfig.cleanup`): docker its labelled containers whose run is gone
(`docker.clean_containers`), bwrap its cgroups and workdirs (`bwrap_leftovers`), a remote
runtime the sandboxes its service still holds for dead runs. A runtime that cannot look (no
engine, no credentials) says so in a note: there is nothing of it to clean from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metrale.errors import UsageError
from metrale.runtime.base import Capability, CleanupReport


def cleanup(
    runtimes: Sequence[str] | None = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    everything: bool = False,
) -> CleanupReport:
    """Blocking; asks each installed runtime (or those named) that finds its own leftovers to
    remove those of dead runs, and reports what each removed and kept. `options`: flat config
    options per runtime (`{"docker": {"cli": "podman"}}`). A runtime that cannot look (no
    engine, no credentials) says so in a note; the others still clean."""
    from metrale.runtime.configs import runtime_config
    from metrale.runtime.registry import config_class, runtime_names

    report = CleanupReport()
    for name in runtimes if runtimes is not None else runtime_names():
        try:
            cls = config_class(name)
        except UsageError as exc:
            if runtimes is not None and name not in runtime_names():
                raise  # a name the user gave that is not installed: their mistake
            report.notes.append(f"{name}: not checked: {exc}")
            continue
        if Capability.LEFTOVERS not in cls.capabilities:
            if runtimes is not None:
                report.notes.append(f"{name}: leaves nothing behind to look for")
            continue
        try:
            config = runtime_config(name, **dict((options or {}).get(name, {})))
            config.cleanup(report, everything=everything)
        except UsageError as exc:
            report.notes.append(f"{name}: not checked: {exc}")
    return report
