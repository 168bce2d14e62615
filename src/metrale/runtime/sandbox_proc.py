"""The sandbox's PID 1, held by a pidfd, and killing inside its PID namespace without trusting
a pid.

A pid alone names whatever process holds that number now: once the sandbox died (`kill -9 -1`
inside), the host may have reused it. So the pidfd taken at start (while the sandbox was known
alive) says whether PID 1 still lives, and every process killed here is first checked to be
in the sandbox's PID namespace, before and after its pidfd is taken, and is signalled through
that pidfd: a pid the host reused in between is never signalled. Commands never enter from
the host: the sandbox's own command forks them (`bwrap_exec`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from pathlib import Path

from metrale.runtime.base import SandboxLostError

#: ioctl on a namespace fd returning an fd of its parent (linux/nsfs.h: _IO(0xb7, 0x2)).
NS_GET_PARENT = 0xB702
#: PID namespaces nest at most 32 deep.
MAX_PID_NS_DEPTH = 33


class SandboxProcess:
    """PID 1 of one sandbox (bwrap's init inside the new PID namespace)."""

    def __init__(self, pid: int, parent: int) -> None:
        """Take a pidfd of `pid` and check that it is the sandbox: a child of `parent` (our
        bwrap) and PID 1 of a PID namespace of its own. RuntimeError otherwise."""
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        try:
            status = _proc_read(f"/proc/{pid}/status")
            nspids = _field(status, b"NSpid").split()  # its pid in each namespace, ours first
            ppid = _field(status, b"PPid")
            if ppid != str(parent).encode() or len(nspids) < 2 or nspids[-1] != b"1":
                raise RuntimeError(f"pid {pid} is not the sandbox bwrap reported")
            if not self.alive():
                raise RuntimeError(f"the sandbox (pid {pid}) exited during start")
            #: the sandbox's own command (bwrap's first child, the executor): PID 1 exits
            #: when it does, so `kill_commands` spares it; read now, before any command ran,
            #: since orphans are reparented to PID 1 later
            self.keep = _children(pid)
            self._own = [os.pidfd_open(p) for p in self.keep]
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        """True until the process exits (a pidfd polls readable once it has, zombie or not)."""
        if self.pidfd < 0:
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def whole(self) -> bool:
        """Whether PID 1 and its own command (the executor) both live: once the executor has
        exited, PID 1 follows it out, so the sandbox is lost already."""
        if not self.alive():
            return False
        poller = select.poll()
        for fd in self._own:
            poller.register(fd, select.POLLIN)
        return not poller.poll(0)

    def wait(self, timeout_s: float) -> bool:
        """Blocking: whether the process exited within `timeout_s`."""
        if self.pidfd < 0:
            return True
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))

    def kill_commands(self, rounds: int = 500) -> int:
        """Blocking: SIGKILL every process of the sandbox's PID namespace but PID 1 and its own
        command, scanning again until a scan finds none alive (a killed process is found again
        until it has exited; zombies are skipped: they hold nothing), so on return all are
        gone. Returns how many signals were sent; OSError when some outlive every round.

        Each candidate is checked twice around taking its pidfd (in the namespace before and
        after), so a pid the host reused in between is never signalled."""
        try:
            ns = os.stat(f"/proc/{self.pid}/ns/pid")
        except OSError:
            raise SandboxLostError("the sandbox is gone (its PID 1 exited)") from None
        key = (ns.st_dev, ns.st_ino)
        spared = {self.pid, *self.keep}
        sent = 0
        for _ in range(rounds):
            found = 0
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) in spared or _dead(entry):
                    continue
                fd = _pidfd_in(int(entry), key)
                if fd is None:
                    continue
                found += 1
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    sent += 1
                os.close(fd)
            if not found:
                return sent
            time.sleep(0.002)
        raise OSError(f"processes of the sandbox outlived {rounds} rounds of SIGKILL")

    def kill_tree(self, nspid: int, rounds: int = 500) -> int:
        """Blocking: SIGKILL the process that is `nspid` in the sandbox's PID namespace and
        every process descending from it, scanning again until none is left alive (a process
        whose parent died before a scan found it is reparented to PID 1 and escapes this, as
        a `setsid` daemon escapes a process group kill; `kill_commands` ends those). Parents
        go before their children: a shell killed after its child would run its next command
        first (`sleep 9; echo late` printed `late` past its timeout). PID 1 and the sandbox's
        own command are never signalled. Returns how many signals were sent."""
        try:
            ns = os.stat(f"/proc/{self.pid}/ns/pid")
        except OSError:
            return 0  # the sandbox is gone, and everything in it
        key = (ns.st_dev, ns.st_ino)
        spared = {self.pid, *self.keep}
        sent = 0
        for _ in range(rounds):
            tree = _tree(nspid, key, spared)
            if not tree:
                return sent
            for pid in tree:
                fd = _pidfd_in(pid, key)
                if fd is None:
                    continue
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    sent += 1
                os.close(fd)
            time.sleep(0.002)
        raise OSError(f"processes of a command outlived {rounds} rounds of SIGKILL")

    def close(self) -> None:
        for fd in (self.pidfd, *getattr(self, "_own", ())):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = -1
        self._own = []


def _proc_read(path: str) -> bytes:
    """A small `/proc` file whole, in one `read` (a fifth of `Path.read_text`'s cost: each
    start reads two, on the event loop)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _field(status: bytes, name: bytes) -> bytes:
    """The value of line `name:` of a `/proc/PID/status` text, stripped (b"" if none)."""
    start = status.find(b"\n" + name + b":\t")
    if start < 0:
        return b""
    start += len(name) + 3
    end = status.find(b"\n", start)
    return status[start : end if end >= 0 else None].strip()


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in _proc_read(f"/proc/{pid}/task/{pid}/children").split()}
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: ask every process for its parent
        found = set()
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = Path(f"/proc/{entry}/stat").read_bytes()
                if int(raw[raw.rfind(b")") + 2 :].split()[1]) == pid:
                    found.add(int(entry))
        return found


def _tree(nspid: int, ns: tuple[int, int], spared: set[int]) -> list[int]:
    """Host pids of the live process that is `nspid` in PID namespace `ns` and of its live
    descendants, each after its parent (a zombie's `NSpid` is still shown: skipped, it holds
    nothing)."""
    parents: dict[int, int] = {}
    root = None
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        nspids = fields.get("NSpid", "").split()
        if fields.get("State", "Z")[0] in "ZX" or len(nspids) < 2:
            continue
        if not _same_ns(int(entry), ns):
            continue
        parents[int(entry)] = int(fields.get("PPid", "0"))
        if nspids[1] == str(nspid):  # the sandbox's level, below metrale's own
            root = int(entry)
    return [] if root is None else family(root, parents)


def family(root: int, parents: dict[int, int]) -> list[int]:
    """`root` and its descendants by `parents` (pid: its parent's pid), each after its parent.
    A loop (a pid reused between two reads of one scan can close one) is walked once."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, seen = [root], {root}
    for pid in tree:  # breadth first: the list grows as it is walked
        grown = [c for c in children.get(pid, ()) if c not in seen]
        seen.update(grown)
        tree += grown
    return tree


def _dead(pid: str) -> bool:
    """Whether `pid` has exited (a zombie waiting for its parent, whom the executor, blocked
    reading its next script, may not be for a while) or is gone: nothing to kill."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] in (b"Z", b"X")


def _same_ns(pid: int, ns: tuple[int, int]) -> bool:
    """Whether `pid` is in PID namespace `ns` or one nested in it (a command can make its own,
    `unshare --user --pid`, and a daemon there is the sandbox's as much as any other)."""
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for _ in range(MAX_PID_NS_DEPTH):
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == ns:
                return True
            try:  # EPERM at the top (the host's namespace): not the sandbox's
                parent = fcntl.ioctl(fd, NS_GET_PARENT)
            except OSError:
                return False
            os.close(fd)
            fd = parent
        return False
    finally:
        os.close(fd)


def _pidfd_in(pid: int, ns: tuple[int, int]) -> int | None:
    """A pidfd of `pid` if it is in PID namespace `ns`, checked before and after it is taken."""
    if not _same_ns(pid, ns):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if not _same_ns(pid, ns):
        os.close(fd)
        return None
    return fd
