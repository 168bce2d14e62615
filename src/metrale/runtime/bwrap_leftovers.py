"""What dead runs of the bwrap runtime leave on this host, and how `metrale cleanup` finds it:
sandbox cgroups `metrale-bwrap-*` (pids, memory) that no live run owns, with any orphaned bwrap
still in them killed; workdirs `metrale-bwrap-*` that neither a live cgroup nor a live
process's command line names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from metrale.runtime.base import CleanupReport
from metrale.runtime.bwrap_setup import WORKDIR_PREFIX, leftover_cgroups, leftover_workdirs
from metrale.runtime.cgroups import SandboxCgroup


def _cmdlines() -> list[bytes]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes())
    return found


def _parent(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[1]  # the field after the state


def _owner_alive(name: str) -> bool:
    """Whether the metrale process a sandbox's workdir or cgroup is named after
    (`metrale-bwrap-<pid>-...`) is alive: a sandbox being started has its workdir and cgroup
    before any process of its own names them, and must not be taken for a dead run's."""
    pid = name[len(WORKDIR_PREFIX) :].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        return b"metrale" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _run_alive(procs: list[str]) -> bool:
    """Whether a sandbox's processes still belong to a live run: one of them has a parent
    outside the cgroup that is not init (metrale itself, for its bwrap and its commands). A
    sandbox whose run died has been re-parented to init (an orphaned bwrap)."""
    inside = set(procs)
    for pid in procs:
        parent = _parent(pid)
        if parent is not None and parent not in inside and parent not in ("0", "1"):
            return True
    return False


def clean_bwrap(report: CleanupReport, tmp: Path | None = None) -> None:
    """Sandbox cgroups and workdirs of dead runs: a cgroup whose processes no live run owns is
    emptied (an orphaned bwrap killed) and removed; a workdir is removed unless a live cgroup
    or a live process's command line names it. `tmp`: look only there for workdirs."""
    live: set[str] = set()
    for cgroup in leftover_cgroups():
        try:
            procs = (cgroup / "cgroup.procs").read_text().split()
        except OSError:
            continue
        if (procs and _run_alive(procs)) or _owner_alive(cgroup.name):
            live.add(cgroup.name)
            report.kept.append(f"cgroup {cgroup} ({len(procs)} live process(es))")
            continue
        # kills what a dead run left in it (an orphaned bwrap), then removes it
        SandboxCgroup([cgroup], pids=False, memory=False).remove()
        if cgroup.exists():
            report.notes.append(f"could not remove cgroup {cgroup}")
        else:
            what = f" and its {len(procs)} orphaned process(es)" if procs else ""
            report.removed.append(f"cgroup {cgroup}{what}")
    cmdlines = _cmdlines()
    workdirs = sorted(tmp.glob(f"{WORKDIR_PREFIX}*")) if tmp is not None else leftover_workdirs()
    for workdir in workdirs:
        if not workdir.is_dir() or workdir.is_symlink():
            continue
        needle = str(workdir).encode()
        if workdir.name in live or _owner_alive(workdir.name) or any(needle in c for c in cmdlines):
            report.kept.append(f"workdir {workdir} (its sandbox is alive)")
            continue
        shutil.rmtree(workdir, ignore_errors=True)
        if workdir.exists():
            report.notes.append(f"could not remove workdir {workdir} entirely")
        else:
            report.removed.append(f"workdir {workdir}")
