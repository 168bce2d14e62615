"""The sandbox's `/etc`: one read-only copy of the few host files a program needs, per process.

Binding each of `ETC_FILES` into every sandbox cost one mount apiece, and mounts are the part
of a sandbox start that the kernel serialises: on this 2-core machine, 15 file binds took a
bare `bwrap ... true` from 7.5 ms to 14 ms each, started one after another, and the same again
at 512 at once (`benchmarks/bwrap_scale.py`). So each metrale process copies those entries once
into a directory of its own and every sandbox binds that one directory at `/etc`: one mount.

What the sandbox sees is what it saw before, or less:
- only `ETC_FILES`; a file only when the host lets everyone read it, a directory without what
  is not world-readable (`/etc/ssl/private` stays behind); no setuid/setgid bit survives;
- a file's content, not its symlink (`/etc/resolv.conf -> /run/...` would dangle inside);
  symlinks within a copied directory stay links (`/etc/ssl/certs` -> `/usr/share/...`);
- read-only: bound with `--ro-bind`, its files owned by metrale's user (root: unmapped inside).

The copy is taken when the process starts its first sandbox, so an edit to the host's `/etc`
during a run is seen by the next run, not this one. It goes on `/dev/shm` where the host has
it (`bwrap_setup.etc_root`: on a disk, ~700 inodes made and deleted a run cost ~40 times the
CPU), else beside the workdirs. It is named like a workdir (`metrale-bwrap-<pid>-etc-*`): the
watchdog removes it when a SIGKILLed metrale leaves it, `metrale cleanup` keeps it while its
process lives; a normal exit removes it at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

#: /etc entries a program commonly needs; nothing else of the host's /etc is visible.
ETC_FILES = (
    "alternatives", "ca-certificates", "ssl", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "localtime", "nsswitch.conf", "hosts", "resolv.conf", "passwd", "group", "python3",
    "mime.types", "protocols", "services", "os-release", "debian_version",
)  # fmt: skip

_lock = threading.Lock()
#: (pid that made it, its path): a forked child makes its own
_view: tuple[int, Path] | None = None


def etc_view(tmp: str, prefix: str, host_etc: str = "/etc") -> str:
    """The path of this process's `/etc` copy under `tmp` (made on the first call, thread-safe).
    `prefix` is this process's workdir prefix (`metrale-bwrap-<pid>-`). OSError when it cannot
    be made (nothing partial is left)."""
    global _view
    with _lock:
        if _view is not None and _view[0] == os.getpid() and _view[1].is_dir():
            return str(_view[1])
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}etc-", dir=tmp))
        try:
            _fill(Path(host_etc), path)
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            raise
        if _view is None:
            atexit.register(remove_etc_view)
        _view = (os.getpid(), path)
        return str(path)


def remove_etc_view() -> None:
    """Remove this process's copy (at exit; a sandbox still running keeps its mount)."""
    global _view
    with _lock:
        if _view is not None and _view[0] == os.getpid():
            shutil.rmtree(_view[1], ignore_errors=True)
        _view = None


def _world_readable(mode: int) -> bool:
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


def _copy_file(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o444)


def _copy_dir(src: Path, dst: Path) -> None:
    os.mkdir(dst)
    for entry in os.scandir(src):
        target = dst / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
            continue
        mode = entry.stat(follow_symlinks=False).st_mode
        if not _world_readable(mode):
            continue
        if stat.S_ISDIR(mode):
            _copy_dir(Path(entry.path), target)
        elif stat.S_ISREG(mode):
            _copy_file(Path(entry.path), target)
    os.chmod(dst, 0o755)


def _fill(host_etc: Path, view: Path) -> None:
    for name in ETC_FILES:
        src = host_etc / name
        try:
            mode = src.stat().st_mode  # the target of a top-level link: its content is copied
        except OSError:
            continue
        if not _world_readable(mode):
            continue
        if stat.S_ISDIR(mode):
            _copy_dir(src, view / name)
        elif stat.S_ISREG(mode):
            _copy_file(src, view / name)
    os.chmod(view, 0o755)
