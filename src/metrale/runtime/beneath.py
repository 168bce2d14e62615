"""Host-side file transfer into a directory that a sandbox can change under us.

A sandbox may swap any path under its workdir for a symlink to a host path at any moment, so
"check, then open" is a race it wins. Here every path is resolved beneath a directory fd with
no symlink followed at any step, in one step: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` (Linux >= 5.6), else a walk that opens one component
at a time relative to the previous one with `O_NOFOLLOW`. Either way a symlink anywhere on the
path is `SymlinkInPath` (the caller then does the transfer inside the sandbox, where links
resolve to the sandbox's own files), and only regular files are read or written (a FIFO would
block the host thread forever).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat

SYS_OPENAT2 = 437  # the same number on x86_64, aarch64 and the other asm-generic arches
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SymlinkInPath(OSError):
    """A component of the path is a symlink (or not a regular file / directory)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def components(path: str) -> list[str]:
    """The names of a relative path; ValueError for `..`, an absolute path or an empty one."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or not parts or ".." in parts:
        raise ValueError(f"{path!r} is not a path beneath the workdir")
    return parts


def openat2(dir_fd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    """`openat2(2)` of `path` relative to `dir_fd` with the `RESOLVE_*` bits `resolve` (the
    descriptor is close-on-exec). OSError with the kernel's errno on failure: ENOSYS or EPERM
    mean no openat2 here (an old kernel, or a seccomp filter refusing it)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc().syscall(SYS_OPENAT2, dir_fd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), path)


def no_openat2(exc: OSError) -> bool:
    """Whether `openat2` failed because this kernel (or its seccomp filter) lacks it."""
    return exc.errno in (errno.ENOSYS, errno.EPERM)


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int | None:
    """fd, or None when the kernel has no openat2 (then the caller walks)."""
    try:
        return openat2(dir_fd, path, flags, mode, _RESOLVE)
    except OSError as exc:
        if no_openat2(exc):
            return None
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise SymlinkInPath(
                exc.errno, f"{path}: a symlink or mount point is in the way"
            ) from None
        raise


def walk(dir_fd: int, parts: list[str], *, create_dirs: bool, owner: tuple[int, int] | None) -> int:
    """An O_PATH-free fd of the directory `parts` names under `dir_fd`, never following a
    link; with `create_dirs`, missing directories are made (owned by `owner`)."""
    fd = os.dup(dir_fd)
    try:
        for name in parts:
            try:
                nxt = os.open(name, _NOFOLLOW_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create_dirs:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
                nxt = _open_dir(fd, name)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SymlinkInPath(exc.errno, f"{name}: not a plain directory") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_dir(fd: int, name: str) -> int:
    try:
        return os.open(name, _NOFOLLOW_DIR, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SymlinkInPath(exc.errno, f"{name}: not a plain directory") from None
        raise


def _open_leaf(dir_fd: int, name: str, flags: int, mode: int) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkInPath(exc.errno, f"{name}: a symlink") from None
        raise


def _regular(fd: int, path: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SymlinkInPath(errno.EINVAL, f"{path}: not a regular file")


def read_beneath(root: str, path: str) -> bytes:
    """The bytes of regular file `path` beneath directory `root`, no link followed."""
    parts = components(path)
    root_fd = os.open(root, _NOFOLLOW_DIR)
    try:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
        fd = _openat2(root_fd, "/".join(parts), flags, 0)
        if fd is None:
            parent = walk(root_fd, parts[:-1], create_dirs=False, owner=None)
            try:
                fd = _open_leaf(parent, parts[-1], flags, 0)
            finally:
                os.close(parent)
    finally:
        os.close(root_fd)
    _regular(fd, path)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_beneath(
    root: str, path: str, data: bytes, *, owner: tuple[int, int] | None = None
) -> None:
    """Write regular file `path` beneath directory `root` (parents made as needed), no link
    followed; new files and directories get `owner` (the sandbox's host uid/gid)."""
    parts = components(path)
    root_fd = os.open(root, _NOFOLLOW_DIR)
    try:
        parent = walk(root_fd, parts[:-1], create_dirs=True, owner=owner)
    finally:
        os.close(root_fd)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
        fd = _open_leaf(parent, parts[-1], flags, 0o644)
    finally:
        os.close(parent)
    _regular(fd, path)
    with os.fdopen(fd, "wb") as f:
        if owner is not None:
            os.fchown(f.fileno(), *owner)
        f.truncate(0)
        f.write(data)
