"""Filling a bwrap sandbox's workdir from a tree on the host: the user's `seed` directory, or
an image's WORKDIR inside its exported root. metrale does this as root, before the sandbox
exists, so the tree is read as data that an image author wrote, never as paths to follow:

- the WORKDIR is resolved **inside** the image root as the sandbox would resolve it (`openat2`
  with `RESOLVE_IN_ROOT`: an absolute link or `..` stays in the image, `/proc/self/root/...`
  names the image's empty `proc`, never the host's); a kernel without openat2 refuses any link
  on the way;
- below it, every entry is opened relative to its parent's fd with `O_NOFOLLOW`: directories
  and regular files are copied, symlinks are copied as links (they resolve inside the sandbox),
  and device nodes, FIFOs and sockets are skipped, each named in `Seeded.skipped` (a device
  node read as root would copy the raw disk, or `/dev/zero` until the disk fills);
- the copy is bounded: `max_bytes` of file sizes (a sparse 3 GB file counts as 3 GB) and
  `MAX_ENTRIES` entries; past either, `SeedTooLarge` before anything more is written;
- no setuid/setgid bit survives (modes are masked to 0o777; ownership is handed over after).

A WORKDIR the image lacks is an empty workdir, as docker and podman create a missing working
directory at container start; one that exists but is not a directory is `SeedError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from metrale.runtime import beneath

#: openat2's RESOLVE_IN_ROOT: resolve as if the directory fd were the root (links included).
RESOLVE_IN_ROOT = 0x10
#: Entries (files, directories, links) a seed may hold.
MAX_ENTRIES = 200_000
_COPY_CHUNK = 1 << 20


class SeedError(OSError):
    """The seed cannot be copied (named, with the reason)."""


class SeedTooLarge(SeedError):
    """The seed holds more than the copy's bound."""


@dataclass
class Seeded:
    """What a copy did: bytes and entries copied, and what it skipped and why."""

    bytes: int = 0
    entries: int = 0
    skipped: list[str] = field(default_factory=list)


def open_in_root(root: str, path: str) -> int | None:
    """A directory fd of `path` (absolute, as inside the image) resolved within `root`; None
    when it does not exist there. SeedError when it is not a directory, or passes a link and
    the kernel cannot resolve links safely."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        rel = path.strip("/") or "."
        resolve = RESOLVE_IN_ROOT | beneath.RESOLVE_NO_MAGICLINKS | beneath.RESOLVE_NO_XDEV
        try:
            return beneath.openat2(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY, 0, resolve)
        except OSError as exc:
            if not beneath.no_openat2(exc):
                _raise_unless_missing(exc.errno or 0, path)
                return None
        try:  # no openat2: one component at a time, no link followed at all
            return beneath.walk(root_fd, beneath.components(rel), create_dirs=False, owner=None)
        except FileNotFoundError:
            return None
        except (beneath.SymlinkInPath, ValueError) as exc:
            raise SeedError(f"WORKDIR {path} passes a link this kernel cannot resolve safely "
                            f"inside the image (no openat2): {exc}") from None  # fmt: skip
    finally:
        os.close(root_fd)


def _raise_unless_missing(err: int, path: str) -> None:
    """A WORKDIR the image lacks is an empty workdir (as docker makes it); any other failure to
    open it is said."""
    if err == errno.ENOENT:
        return
    if err == errno.ENOTDIR:
        raise SeedError(f"WORKDIR {path} is not a directory in the image")
    if err in (errno.ELOOP, errno.EXDEV):
        raise SeedError(f"WORKDIR {path} resolves through a loop or out of the image's tree")
    raise SeedError(err, f"WORKDIR {path}: {os.strerror(err)}")


def copy_seed(src_fd: int, dest: Path, max_bytes: int) -> Seeded:
    """Blocking: copy the tree at directory fd `src_fd` into the empty directory `dest` (see
    the module docstring). `src_fd` stays open; the caller closes it."""
    done = Seeded()
    _copy_dir(src_fd, dest, "", done, max_bytes)
    return done


def _copy_dir(dir_fd: int, dest: Path, rel: str, done: Seeded, max_bytes: int) -> None:
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        done.entries += 1
        if done.entries > MAX_ENTRIES:
            raise SeedTooLarge(f"the workdir's seed holds more than {MAX_ENTRIES} entries")
        where = f"{rel}{name}"
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        target = dest / name
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=dir_fd), target)
        elif stat.S_ISDIR(st.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dir_fd)  # fmt: skip
            try:
                target.mkdir(mode=0o700)
                _copy_dir(sub, target, f"{where}/", done, max_bytes)
            finally:
                os.close(sub)
            os.chmod(target, stat.S_IMODE(st.st_mode) & 0o777)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(dir_fd, name, target, where, done, max_bytes)
        else:
            done.skipped.append(f"{where}: {_kind(st.st_mode)}, not copied")


def _copy_file(
    dir_fd: int, name: str, target: Path, where: str, done: Seeded, max_bytes: int
) -> None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since the lstat: skip it the same way
            done.skipped.append(f"{where}: {_kind(st.st_mode)}, not copied")
            return
        if done.bytes + st.st_size > max_bytes:
            raise SeedTooLarge(
                f"the workdir's seed is larger than {max_bytes >> 20} MB (at {where}, "
                f"{st.st_size} bytes)"
            )
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            left = st.st_size  # never more than the size checked, whatever the file does
            while left > 0:
                chunk = memoryview(os.read(fd, min(_COPY_CHUNK, left)))
                if not chunk:
                    break
                left -= len(chunk)
                while chunk:
                    chunk = chunk[os.write(out, chunk) :]
            os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
        finally:
            os.close(out)
        with contextlib.suppress(OSError):
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        done.bytes += st.st_size
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
