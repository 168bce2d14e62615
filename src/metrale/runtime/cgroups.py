"""Per-sandbox cgroups: a `pids` bound and a total-`memory` bound that count only one
sandbox's processes, whoever they run as.

RLIMIT_NPROC counts per host user and RLIMIT_AS per process (six 200 MB processes pass a 256 MB
RLIMIT_AS), so a sandbox's totals need a cgroup. Both cgroup layouts are handled: v1 (one
directory per controller hierarchy, as on hosts with a v2 mount beside v1) and v2 (one
directory in the unified hierarchy, where the controller is delegated to our cgroup). A
sandbox's cgroups are children of the cgroup metrale itself is in, named after its workdir
(`metrale-bwrap-XXXX`), so `leftover_cgroups()` can find what a killed metrale left.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def own_cgroup(controller: str) -> Path | None:
    """Where this process sits in the hierarchy that has `controller` (v1), or in the
    unified hierarchy (v2) when `controller` is delegated there; None otherwise. Read once
    per process (each sandbox asked twice, on a worker thread)."""
    return _own_cgroup(os.getpid(), controller)


@functools.lru_cache(maxsize=16)
def _own_cgroup(_pid: int, controller: str) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            base = CGROUP_ROOT / controller
            return base / path.lstrip("/")
    for line in lines:
        hier, controllers, path = line.split(":", 2)
        if hier == "0" and controllers == "":
            here = CGROUP_ROOT / path.lstrip("/")
            try:
                enabled = (here / "cgroup.subtree_control").read_text().split()
            except OSError:
                return None
            return here if controller in enabled else None
    return None


def _put(path: Path, value: str) -> None:
    """Write `value` to the cgroup file `path` in one `write(2)` (OSError as the kernel
    refuses it): `Path.write_text`'s text layer cost ~4x the system calls, on a worker
    thread at every start."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _write(path: Path, value: str) -> bool:
    try:
        _put(path, value)
    except OSError:
        return False
    return True


class SandboxCgroup:
    """The cgroup directories holding one sandbox (one per v1 hierarchy, or one v2 directory),
    with `pids` and `memory` limits set where the host lets us. `create()` returns None when
    neither bound can be had; the caller then relies on rlimits and says so."""

    def __init__(self, paths: list[Path], *, pids: bool, memory: bool) -> None:
        self.paths = paths
        #: whether the sandbox's process count / total memory are bounded by this cgroup
        self.bounds_pids = pids
        self.bounds_memory = memory

    @property
    def path(self) -> Path:
        """The first directory (kept for callers that knew only the pids cgroup)."""
        return self.paths[0]

    @classmethod
    def create(
        cls, name: str, *, max_pids: int | None, memory_mb: int | None
    ) -> SandboxCgroup | None:
        made: dict[Path, Path] = {}  # parent -> child
        bounds = {"pids": False, "memory": False}
        for controller, limit in (("pids", max_pids), ("memory", memory_mb)):
            if limit is None:
                continue
            parent = own_cgroup(controller)
            if parent is None or not os.access(parent, os.W_OK):
                continue
            child = made.get(parent)
            if child is None:
                child = parent / name
                try:
                    child.mkdir()
                except OSError:
                    continue
                made[parent] = child
            if controller == "pids":
                bounds["pids"] = _write(child / "pids.max", str(limit))
            else:
                bounds["memory"] = _set_memory(child, limit << 20)
        cgroup = cls(list(made.values()), pids=bounds["pids"], memory=bounds["memory"])
        if not (cgroup.bounds_pids or cgroup.bounds_memory):
            cgroup.remove()
            return None
        return cgroup

    def enter(self, *pids: int) -> None:
        """Blocking: move each of `pids` (and so all they start from now on) into these
        cgroups; OSError naming the cgroup when the host refuses. One write per process and
        cgroup, no process of its own."""
        for path in self.paths:
            for pid in pids:
                try:
                    _put(path / "cgroup.procs", str(pid))
                except OSError as exc:
                    raise OSError(exc.errno, f"cannot move pid {pid} into cgroup {path}") from exc

    def remove(self) -> None:
        """Blocking: kills what is left in the cgroups, waits briefly for it to leave, then
        removes them. Idempotent."""
        for path in self.paths:
            _remove(path)


def _set_memory(path: Path, limit: int) -> bool:
    if (path / "memory.max").exists():  # v2: no swap, so the bound is real memory
        ok = _write(path / "memory.max", str(limit))
        _write(path / "memory.swap.max", "0")
        return ok
    ok = _write(path / "memory.limit_in_bytes", str(limit))
    # v1: memsw (memory + swap) must be >= the memory limit; absent without swap accounting
    _write(path / "memory.memsw.limit_in_bytes", str(limit))
    return ok


def _remove(path: Path) -> None:
    for _ in range(300):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.01)
    logger.warning("cgroup %s still busy after 3 s: left for 'metrale cleanup'", path)


def leftover_cgroups(prefix: str) -> list[Path]:
    """Every cgroup directory named `prefix*` up to three levels below a controller's root
    (`pids`, `memory`, or the unified hierarchy): what killed runs left. A later process may sit
    in another cgroup than the run that made them, hence the walk rather than our own parent."""
    found: set[Path] = set()
    roots = [CGROUP_ROOT / c for c in ("pids", "memory", "unified")] + [CGROUP_ROOT]
    for root in roots:
        if not (root / "cgroup.procs").exists():
            continue
        level = [root]
        for _ in range(3):
            below: list[Path] = []
            for d in level:
                with contextlib.suppress(OSError):
                    for entry in d.iterdir():
                        if entry.is_dir() and not entry.is_symlink():
                            if entry.name.startswith(prefix):
                                found.add(entry)
                            else:
                                below.append(entry)
            level = below
    return sorted(found)
