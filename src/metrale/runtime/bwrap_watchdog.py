"""A backstop for SIGKILL: one watchdog process per metrale process that uses bwrap.

The parent-death signals (bwrap's `--die-with-parent`, on itself and on its child) leave
windows that are not ours to close: each is set only after its process was made, so a
metrale (or a bwrap) killed in between leaves its child running (seen under load when metrale
is SIGKILLed in the first milliseconds of a start). The watchdog waits for its owner to die (a
pidfd: a reused pid is never mistaken for it), then kills every process in the cgroups of the
owner's sandboxes and every process naming one of its workdirs, removes those cgroups and
workdirs, and sweeps again twice, for a start that was in flight at the kill: such a start's
bwrap may have made the sandbox's PID 1 before the first sweep killed it, and that child,
outside the cgroups (it enters them once ready) and left waiting for its dead parent forever,
is found by the workdir its command line names, removed or not. After a normal
exit (the owner says so on the watchdog's stdin, `procs.CLEAN_EXIT`) one sweep is enough: no
start is in flight then, and the watchdog is gone a moment after its owner.

The owner's sandboxes are found by name: their workdirs are `<tmp>/metrale-bwrap-<owner pid>-*`
and each cgroup is named after its workdir.
"""

from __future__ import annotations

import os

from metrale.runtime import procs

_PROGRAM = r"""
import os, select, shutil, signal, sys, time
from pathlib import Path
pid, tmp, prefix = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
try:
    fd = os.pidfd_open(pid)
    select.select([fd], [], [])
except (OSError, AttributeError):
    while os.path.exists(f"/proc/{pid}"):
        time.sleep(0.2)
try:  # its owner gone, its end is closed: this returns at once
    clean = sys.stdin.buffer.read(6) == b"clean\n"
except (OSError, ValueError, AttributeError):
    clean = False
ROOT = Path("/sys/fs/cgroup")
def cgroups():
    found = []
    for root in [ROOT / "pids", ROOT / "memory", ROOT / "unified", ROOT]:
        level = [root]
        for _ in range(4):
            below = []
            for d in level:
                try:
                    for e in d.iterdir():
                        if e.is_dir() and not e.is_symlink():
                            (found if e.name.startswith(prefix) else below).append(e)
                except OSError:
                    pass
            level = below
    return found
def kill(p):
    try:
        os.kill(int(p), signal.SIGKILL)
    except (OSError, ValueError):
        pass
dirs = set()  # every sweep's: a process left by a start in flight names a dir removed since
for delay in (0,) if clean else (0, 1, 3):
    time.sleep(delay)
    dirs |= {str(d) for root in (tmp, Path("/dev/shm")) for d in root.glob(prefix + "*")}
    for e in os.listdir("/proc"):
        if e.isdigit() and int(e) != os.getpid():
            try:
                cmd = Path(f"/proc/{e}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(d in cmd for d in dirs):
                kill(e)
    groups = cgroups()
    for g in groups:
        try:
            for p in (g / "cgroup.procs").read_text().split():
                kill(p)
        except OSError:
            pass
    time.sleep(0.1)
    for g in groups:
        for _ in range(50):
            try:
                g.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
"""


def owner_prefix(workdir_prefix: str) -> str:
    """The workdir (and cgroup) name prefix of this process's sandboxes."""
    return f"{workdir_prefix}{os.getpid()}-"


def ensure_watchdog(tmp: str, workdir_prefix: str) -> None:
    """Start this process's watchdog for sandboxes under `tmp`, once."""
    procs.ensure_watchdog(
        ("bwrap", tmp),
        _PROGRAM,
        [str(os.getpid()), tmp, owner_prefix(workdir_prefix)],
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
