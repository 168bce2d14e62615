"""Starting a program as another host uid, with no wrapper program in front of it.

`setpriv` in front of bwrap cost an exec (~2 ms of CPU) a sandbox start here, and
`Popen(user=...)` forks the whole interpreter (CPython uses `vfork` only without id changes),
which cost more. Here the calling thread changes its *own* real uid, gid and groups (Linux
keeps credentials per thread; glibc's `setresuid()` would change every thread's, hence the
raw system calls), `posix_spawn`s with `POSIX_SPAWN_RESETIDS` (the child sets its effective ids
to those real ones, and `exec` copies them to the saved ones: the program runs with all of its
ids the new ones, no groups, no capabilities), and changes them back. The thread keeps its
effective uid 0, and with it every capability, throughout, so changing back cannot fail.

The child gets the fds it is given and nothing else (`posix_spawn_file_actions_addclosefrom_np`,
glibc 2.34): an fd that metrale inherited without close-on-exec (a make jobserver's, a CI
runner's) would otherwise reach bwrap and the sandbox with it. Where the machine's system call
numbers or that function are unknown, `can_spawn_as()` is False and callers wrap instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import platform
import signal
from collections.abc import Iterator, Mapping, Sequence

#: setresuid, setresgid, setgroups by machine
_ID_SYSCALLS = {"x86_64": (117, 119, 116), "aarch64": (147, 149, 159)}
#: glibc's posix_spawn flags
_RESETIDS, _SETSIGDEF, _SETSIGMASK, _SETSID = 0x01, 0x04, 0x08, 0x80
#: Signals Python ignores that a child must get back at their default (as `Popen` does).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
#: Room for glibc's opaque `posix_spawn_file_actions_t` (80 bytes), `posix_spawnattr_t` (336)
#: and `sigset_t` (128), with margin.
_OPAQUE = 1024
_UNCHANGED = -1


class _Libc:
    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.syscall = libc.syscall
        self.actions_init = libc.posix_spawn_file_actions_init
        self.actions_destroy = libc.posix_spawn_file_actions_destroy
        self.add_dup2 = libc.posix_spawn_file_actions_adddup2
        self.add_closefrom = libc.posix_spawn_file_actions_addclosefrom_np
        self.attr_init = libc.posix_spawnattr_init
        self.attr_destroy = libc.posix_spawnattr_destroy
        self.set_flags = libc.posix_spawnattr_setflags
        self.set_sigdefault = libc.posix_spawnattr_setsigdefault
        self.set_sigmask = libc.posix_spawnattr_setsigmask
        self.sigemptyset = libc.sigemptyset
        self.sigaddset = libc.sigaddset
        self.posix_spawn = libc.posix_spawn
        self.id_calls = _ID_SYSCALLS[platform.machine()]


@functools.cache
def _libc() -> _Libc | None:
    try:
        return _Libc()
    except (OSError, AttributeError, KeyError):  # no glibc, too old a one, another machine
        return None


def can_spawn_as() -> bool:
    """Whether `start_as` works on this machine."""
    return _libc() is not None


def start_as(
    argv: Sequence[str], env: Mapping[str, str], ids: tuple[int, int] | None, fds: Mapping[int, int]
) -> int:
    """Blocking (until the child has exec'd): start `argv` (an absolute path first) with
    environment `env`, in a session of its own, as host uid and gid `ids` (None: as this
    thread), with child fd `n` a copy of this process's `fds[n]` and no other fd open; its
    pid. OSError when it cannot be started."""
    lib = _libc()
    if lib is None:
        raise OSError("cannot start a program as another uid on this machine")
    above = max(fds, default=2) + 1
    actions = ctypes.create_string_buffer(_OPAQUE)
    attr = ctypes.create_string_buffer(_OPAQUE)
    moved: list[int] = []  # a source below the highest target is first copied above it
    _check(lib.actions_init(actions))
    try:
        _check(lib.attr_init(attr))
        try:
            for target, source in fds.items():
                if source < above:
                    source = fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, above)
                    moved.append(source)
                _check(lib.add_dup2(actions, source, target))
            _check(lib.add_closefrom(actions, above))
            flags = _SETSID | _SETSIGDEF | _SETSIGMASK | (_RESETIDS if ids is not None else 0)
            _check(lib.set_flags(attr, ctypes.c_short(flags)))
            _check(lib.set_sigdefault(attr, _sigset(lib, _DEFAULT_SIGNALS)))
            _check(lib.set_sigmask(attr, _sigset(lib, ())))
            c_argv = _strings([os.fsencode(a) for a in argv])
            c_env = _strings([os.fsencode(f"{k}={v}") for k, v in env.items()])
            pid = ctypes.c_int()
            path = os.fsencode(argv[0])
            with _thread_ids(lib, ids):
                err = lib.posix_spawn(ctypes.byref(pid), path, actions, attr, c_argv, c_env)
            if err:
                raise OSError(err, f"{argv[0]}: {os.strerror(err)}")
            return pid.value
        finally:
            lib.attr_destroy(attr)
            for fd in moved:
                os.close(fd)
    finally:
        lib.actions_destroy(actions)


def _check(err: int) -> None:
    if err:
        raise OSError(err, os.strerror(err))


def _sigset(lib: _Libc, signals: Sequence[int]) -> ctypes.Array[ctypes.c_char]:
    mask = ctypes.create_string_buffer(_OPAQUE)
    lib.sigemptyset(mask)
    for sig in signals:
        lib.sigaddset(mask, int(sig))
    return mask


def _strings(items: list[bytes]) -> ctypes.Array[ctypes.c_char_p]:
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def _syscall(lib: _Libc, number: int, *args: object) -> None:
    if lib.syscall(number, *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"system call {number}: {os.strerror(err)}")


@contextlib.contextmanager
def _thread_ids(lib: _Libc, ids: tuple[int, int] | None) -> Iterator[None]:
    """This thread's real uid and gid set to `ids` and its groups cleared, then put back (its
    effective and saved ids stay, and with them every capability)."""
    if ids is None:
        yield
        return
    setresuid, setresgid, setgroups = lib.id_calls
    uid, gid = ids
    real_uid, real_gid, groups = os.getuid(), os.getgid(), os.getgroups()  # this thread's
    try:
        _syscall(lib, setresgid, ctypes.c_long(gid), _UNCHANGED, _UNCHANGED)
        _syscall(lib, setgroups, 0, None)
        _syscall(lib, setresuid, ctypes.c_long(uid), _UNCHANGED, _UNCHANGED)
        yield
    finally:
        try:
            _syscall(lib, setresuid, ctypes.c_long(real_uid), _UNCHANGED, _UNCHANGED)
            given = (ctypes.c_uint * max(1, len(groups)))(*groups)
            _syscall(lib, setgroups, len(groups), given)
            _syscall(lib, setresgid, ctypes.c_long(real_gid), _UNCHANGED, _UNCHANGED)
        except OSError:  # cannot happen with effective uid 0 kept; if it did, this thread
            os.abort()  # would spawn with another user's ids: stop rather than go on
