"""`metrale cleanup`: remove what killed runs left on this host, and nothing a live run uses.

- docker: containers with the `metrale.sandbox` label whose owning metrale process (the pid and
  host labels) is gone; `--all` also removes those of live runs and of other hosts.
- bwrap: workdirs `<tmp>/metrale-bwrap-*` that no live process names in its command line (a
  live bwrap binds its workdir by path), and `pids` cgroups `metrale-bwrap-*` with no process.

An absent engine is not an error here: there is nothing of it to clean.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from metrale.runtime.docker import HOST_LABEL, LABEL, PID_LABEL, is_podman

PREFIX = "metrale-bwrap-"
#: Where pids cgroups may be (v1 hierarchy, v2 unified mounts); searched this deep.
CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
CGROUP_DEPTH = 8


@dataclass
class CleanupReport:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"removed {item}" for item in self.removed]
        out += [f"kept {item}" for item in self.kept]
        out += self.notes
        if not self.removed:
            out.append("nothing to remove")
        return out


def _cmdlines() -> list[bytes]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes())
    return found


def _pid_alive(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def clean_containers(cli: str, report: CleanupReport, *, everything: bool = False) -> None:
    if shutil.which(cli) is None:
        report.notes.append(f"docker: {cli!r} not on PATH, no containers to look at")
        return
    try:
        listing = subprocess.run(
            [cli, "ps", "-aq", "--filter", f"label={LABEL}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        report.notes.append(f"docker: '{cli} ps' did not answer in 60 s, containers not checked")
        return
    if listing.returncode != 0:
        why = (listing.stderr.strip().splitlines() or ["no engine"])[-1][:200]
        report.notes.append(f"docker: no engine answers {cli!r} ({why}), containers not checked")
        return
    ids = listing.stdout.split()
    if not ids:
        return
    fmt = f'{{{{.Id}}}} {{{{index .Config.Labels "{PID_LABEL}"}}}} '
    fmt += f'{{{{index .Config.Labels "{HOST_LABEL}"}}}} {{{{.Name}}}}'
    inspect = subprocess.run(
        [cli, "inspect", "--format", fmt, *ids], capture_output=True, text=True, timeout=120
    )
    here = socket.gethostname()
    doomed = []
    for line in inspect.stdout.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        cid, pid, host, name = parts[0], parts[1], parts[2], parts[3].lstrip("/")
        if not everything and host != here:
            report.kept.append(f"container {name} (made on host {host}; --all removes it)")
        elif not everything and _pid_alive(pid):
            report.kept.append(f"container {name} (its run, pid {pid}, is alive)")
        else:
            doomed.append((cid, name))
    if doomed:
        rm = [cli, "rm", "-f", *(["-t", "0"] if is_podman(cli) else [])]
        subprocess.run([*rm, *(c for c, _ in doomed)], capture_output=True, timeout=300)
        report.removed += [f"container {name}" for _, name in doomed]


def _bwrap_cgroups() -> list[Path]:
    found: set[Path] = set()
    for root in CGROUP_ROOTS:
        if not (root / "cgroup.procs").exists():
            continue
        base_depth = len(root.parts)
        for here, dirs, _ in os.walk(root):
            depth = len(Path(here).parts) - base_depth
            for name in list(dirs):
                if name.startswith(PREFIX):
                    found.add(Path(here) / name)
                    dirs.remove(name)
            if depth >= CGROUP_DEPTH:
                dirs.clear()
    return sorted(found)


def clean_bwrap(report: CleanupReport, tmp: Path | None = None) -> None:
    tmp = tmp or Path(tempfile.gettempdir())
    cmdlines = _cmdlines()
    busy_cgroups = set()
    for cgroup in _bwrap_cgroups():
        try:
            procs = (cgroup / "cgroup.procs").read_text().split()
        except OSError:
            continue
        if procs:
            busy_cgroups.add(cgroup.name)
            report.kept.append(f"cgroup {cgroup} ({len(procs)} live process(es))")
            continue
        try:
            cgroup.rmdir()
            report.removed.append(f"cgroup {cgroup}")
        except OSError as exc:
            report.notes.append(f"could not remove cgroup {cgroup}: {exc.strerror}")
    for workdir in sorted(tmp.glob(f"{PREFIX}*")):
        if not workdir.is_dir() or workdir.is_symlink():
            continue
        needle = str(workdir).encode()
        if workdir.name in busy_cgroups or any(needle in c for c in cmdlines):
            report.kept.append(f"workdir {workdir} (its sandbox is alive)")
            continue
        shutil.rmtree(workdir, ignore_errors=True)
        if workdir.exists():
            report.notes.append(f"could not remove workdir {workdir} entirely")
        else:
            report.removed.append(f"workdir {workdir}")


def cleanup(cli: str = "docker", *, everything: bool = False) -> CleanupReport:
    """Blocking; removes leftovers of dead runs and reports what it removed and kept."""
    report = CleanupReport()
    clean_containers(cli, report, everything=everything)
    clean_bwrap(report)
    return report
