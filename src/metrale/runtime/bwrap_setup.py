"""How a bwrap sandbox is laid out and launched on the host: the tools it needs, the system
directories it sees, the unprivileged host uid it runs as, the private staging of bind sources,
and where a killed run's leftovers are. The runtime itself (and what each property rests on) is
in `bwrap`."""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from metrale.errors import UsageError
from metrale.runtime import cgroups
from metrale.runtime.procs import HELPER_ENV, host_tool

if TYPE_CHECKING:  # for types only: configs calls check_bwrap
    from metrale.runtime.bwrap_config import BwrapConfig

#: Host temp dirs of sandboxes are `tempfile.gettempdir()/WORKDIR_PREFIX*`; their cgroups are
#: named the same. `metrale cleanup` finds what a killed run left with the two functions below.
WORKDIR_PREFIX = "metrale-bwrap-"
#: The uid and gid commands run as inside the sandbox.
SANDBOX_UID = 1000
#: As root, each sandbox runs as a host uid drawn from [BASE, BASE + RANGE): unused by any
#: account, so files a sandbox leaves grant nothing, and distinct per sandbox, so RLIMIT_NPROC
#: and signals do not cross sandboxes.
HOST_UID_BASE = 1_800_000_000
HOST_UID_RANGE = 100_000_000
#: Top-level system directories bound read-only (or re-created as the same symlink).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt/conda")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The whole environment of bwrap and of every host-side wrapper: nothing of metrale's, of an
#: image's or of a command's (a command's environment is set inside: `bwrap_exec`).
SPAWN_ENV = HELPER_ENV
READY_TIMEOUT_S = 60.0
_TOOLS = (
    ("bwrap", "bubblewrap"), ("setpriv", "util-linux"),
)  # fmt: skip
_ROOT_TOOLS = (("unshare", "util-linux"), ("mount", "mount"))


def sandbox_tmpdir() -> str:
    """Where sandbox temp dirs go: `tempfile.gettempdir()`, unless (as root) the sandbox's
    unprivileged uid could not pass through it (e.g. a 0700 TMPDIR), then /tmp. Asked at
    every start: the answer is kept per temp dir and uid (its stats were ~2% of the event
    loop's time in the 512-sandbox cell)."""
    return _sandbox_tmpdir(tempfile.gettempdir(), privileged())


@functools.lru_cache(maxsize=8)
def _sandbox_tmpdir(base: str, as_root: bool) -> str:
    if not as_root or _traversable(base):
        return base
    return "/tmp"


def _traversable(path: str) -> bool:
    """Whether every directory from / to `path` lets others through (o+x)."""
    current = Path(path).resolve()
    for d in (current, *current.parents):
        try:
            if not d.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def leftover_workdirs() -> list[Path]:
    """Sandbox temp dirs and control dirs still on disk (a live run's included: check before
    removing)."""
    roots = {tempfile.gettempdir(), "/tmp", CONTROL_ROOT}
    found = {p for d in roots for p in Path(d).glob(f"{WORKDIR_PREFIX}*")}
    return sorted(found)


#: Where a sandbox's control and staging directories go (`control_dir`, `stage_dir`).
CONTROL_ROOT = "/dev/shm"


def control_dir(workdir: Path) -> Path:
    """Where the executor's FIFOs of the sandbox whose workdir is `workdir` are made
    (`bwrap_exec`), `<its name>.ctl` (`_beside`). On a disk's filesystem a FIFO is an inode:
    ext4 spent ~0.2 ms of kernel time on each (its allocator skips recently deleted inodes,
    and a run deletes them by the thousand), twice a command."""
    return _beside(workdir, ".ctl")


def stage_dir(workdir: Path) -> Path:
    """Where root's staging paths of the sandbox whose workdir is `workdir` are made
    (`bwrap_layout.fill`), `<its name>.stage` (`_beside`)."""
    return _beside(workdir, ".stage")


def _beside(workdir: Path, suffix: str) -> Path:
    """A directory of the sandbox that the sandbox must not reach (its workdir is its own):
    `CONTROL_ROOT/<workdir's name><suffix>` on a tmpfs where the host has one, else beside the
    workdir. (The suffix: `workdir` itself may be on that tmpfs, with `TMPDIR=/dev/shm`.)"""
    root = workdir.parent if not _usable(CONTROL_ROOT) else Path(CONTROL_ROOT)
    return root / f"{workdir.name}{suffix}"


def etc_root(tmp: str) -> str:
    """Where this process's `/etc` copy goes (`bwrap_etc.etc_view`): `CONTROL_ROOT` where the
    host has it, else `tmp`. On this machine's ext4 the copy's ~700 entries cost ~400 ms of
    CPU against ~10 ms on the tmpfs, and their deletion at exit slowed the next run's
    workdirs (ext4's allocator skips inodes deleted in the last ~30 s)."""
    return CONTROL_ROOT if _usable(CONTROL_ROOT) else tmp


@functools.lru_cache(maxsize=4)
def _usable(root: str) -> bool:
    """Whether `root` is a real directory metrale can make directories in (asked once per
    process: three system calls, twice a start)."""
    path = Path(root)
    return path.is_dir() and not path.is_symlink() and os.access(path, os.W_OK | os.X_OK)


def leftover_cgroups() -> list[Path]:
    """Sandbox cgroup directories still present (pids, memory or unified hierarchy)."""
    return cgroups.leftover_cgroups(WORKDIR_PREFIX)


def privileged() -> bool:
    """Whether metrale runs as root, and so must run bwrap as an unprivileged host uid."""
    return os.geteuid() == 0


def check_bwrap(config: BwrapConfig | None = None) -> None:
    """UsageError when bubblewrap is missing, cannot create namespaces, or a bind is absent."""
    for tool, package in _TOOLS + (_ROOT_TOOLS if privileged() else ()):
        if shutil.which(tool) is None:
            raise UsageError(
                f"bwrap runtime: '{tool}' is not installed (Debian/Ubuntu: apt-get install "
                f"{package})"
            )
    probe_argv = [host_tool("bwrap"), "--unshare-all", "--unshare-user", "--ro-bind", "/", "/"]
    probe_argv += ["--", "true"]
    if privileged():  # the way start() runs it: as an unprivileged host uid
        probe_argv = [*as_uid(HOST_UID_BASE), *probe_argv]
    probe = subprocess.run(
        probe_argv,
        env=SPAWN_ENV,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        raise UsageError(
            f"bwrap runtime: bubblewrap cannot create a sandbox here ({why}); user namespaces "
            "may be disallowed for unprivileged users (sysctl kernel.unprivileged_userns_clone=1, "
            "user.max_user_namespaces > 0, or an AppArmor userns restriction), or root lacks "
            "CAP_SETUID to run it as an unprivileged uid"
        )
    for what, path in (("root", config and config.root), ("seed", config and config.seed)):
        if path and not os.path.isdir(path):
            raise UsageError(f"bwrap runtime: {what} {path} is not a directory")
    for bind in config.binds if config is not None else ():
        if not os.path.exists(bind.src):
            raise UsageError(f"bwrap runtime: bind source {bind.src} does not exist")


@functools.lru_cache(maxsize=1)
def _host_system_dirs() -> tuple[str, ...]:
    """bwrap's arguments for the host's `SYSTEM_DIRS`, read once per process: the host's own
    layout does not change under a run, and its 16 stats a start were ~4% of the event
    loop's time in the 512-sandbox cell."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    return tuple(args)


#: Top-level entries of an image's root that the sandbox makes itself (or must not see).
ROOT_SKIP = ("proc", "dev", "sys", "tmp", "run")


def system_binds(
    root: str | None = None, source: str | None = None, etc: str | None = None
) -> list[str]:
    """bwrap arguments that show the host's system directories read-only, as they are laid
    out here (merged-/usr symlinks stay symlinks).

    With `root` (an exported image), every top-level entry of it but `ROOT_SKIP` is shown
    read-only instead, and nothing of the host's: the sandbox's own root stays the tmpfs that
    holds the mount points, so a workdir, scratch dir or bind the image lacks can still be
    mounted. `source` is where bwrap reaches `root` (root's private staging path when the
    sandbox runs as an unprivileged uid that cannot traverse to it); its layout is read from
    `root`, since the staged path is bound only when bwrap starts.

    Without `root`, `etc` is the directory shown read-only at `/etc` (`bwrap_etc.etc_view`: one
    mount for the few files a program needs); None shows no `/etc` at all."""
    args: list[str] = []
    if root is not None:
        src = source or root
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if entry.name in ROOT_SKIP:
                continue
            if entry.is_symlink():
                args += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]
            elif entry.is_dir() or entry.is_file():
                args += ["--ro-bind", f"{src}/{entry.name}", f"/{entry.name}"]
        return args
    args += _host_system_dirs()
    if etc is not None:
        args += ["--ro-bind", etc, "/etc"]
    return args


def as_uid(uid: int | None) -> list[str]:
    """`setpriv`: run the rest as host `uid`/`gid` with no groups and no capabilities (None: as
    is), dying with its parent (setpriv re-arms the death signal that the uid change clears).
    For what must start as root and drop to `uid` later (the private staging's `mount`s, the
    probe); a start without staging changes ids in the spawner instead (`spawn.spawn_as`)."""
    ids = [] if uid is None else ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"]
    return [host_tool("setpriv"), *ids, "--pdeathsig", "KILL", "--"]


#: The fd on which bwrap reports its sandbox's pid (`--json-status-fd`): the child's number.
STATUS_FD = 3


def stage_argv(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A private mount namespace in which root binds each source onto its staging path, then
    runs the rest: bwrap (unprivileged) binds from staging paths it can reach, and the host's
    mount table never sees them."""
    if not pairs:
        return []
    mount = shlex.quote(host_tool("mount"))
    script = f'while [ "$1" != -- ]; do {mount} --rbind "$1" "$2" || exit 125; shift 2; done; '
    script += 'shift; exec "$@"'
    flat = [x for pair in pairs for x in pair]
    return [host_tool("unshare"), "--mount", "--propagation", "private", "--", host_tool("sh"),
            "-c", script, "sh", *flat, "--"]  # fmt: skip


def hand_over(path: Path, uid: int) -> None:
    """Blocking: chown `path` and everything under it (links themselves, never followed) to
    `uid`, so the sandbox user can write it. Root's chown also clears setuid/setgid bits."""
    os.lchown(path, uid, uid)
    if path.is_symlink() or not path.is_dir():
        return
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(root, name), uid, uid)
