"""The sandbox's PID 1, held by a pidfd, and entering its namespaces without trusting a pid.

`nsenter -t PID` opens `/proc/PID/ns/*` by number: if the sandbox died (`kill -9 -1` inside)
and the host reused its pid, the command would join a host process's namespaces and run on the
host. Here every entry opens the namespace files, root and cwd of `/proc/PID` itself and only
then asks the pidfd (taken once, at start, while the sandbox was known alive) whether that
process still lives: if it does, the pid cannot have been reused in between, so the fds are the
sandbox's; if not, `SandboxLostError`. nsenter then gets those fds (`--user=/proc/self/fd/N`,
...), never the pid, so nothing after the check can swap what it joins. No window is left: a
pidfd alone does not stop reuse, checking after opening does.
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
from metrale.runtime.procs import host_tool

#: ioctl on a namespace fd returning an fd of its parent (linux/nsfs.h: _IO(0xb7, 0x2)).
NS_GET_PARENT = 0xB702
#: PID namespaces nest at most 32 deep.
MAX_PID_NS_DEPTH = 33

#: /proc/PID/ns entries and the nsenter option joining each (the user namespace is joined last
#: by nsenter when it runs as root, so the others are joined with the host's privileges).
NAMESPACES = (
    ("user", "--user"), ("mnt", "--mount"), ("pid", "--pid"), ("net", "--net"),
    ("ipc", "--ipc"), ("uts", "--uts"), ("cgroup", "--cgroup"),
)  # fmt: skip


class SandboxProcess:
    """PID 1 of one sandbox (bwrap's init inside the new PID namespace)."""

    def __init__(self, pid: int, parent: int) -> None:
        """Take a pidfd of `pid` and check that it is the sandbox: a child of `parent` (our
        bwrap) and PID 1 of a PID namespace of its own. RuntimeError otherwise."""
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            nspids = fields.get("NSpid", "").split()
            if int(fields.get("PPid", "-1")) != parent or len(nspids) < 2 or nspids[-1] != "1":
                raise RuntimeError(f"pid {pid} is not the sandbox bwrap reported")
            if not self.alive():
                raise RuntimeError(f"the sandbox (pid {pid}) exited during start")
            #: the sandbox's own command (bwrap's first child, the ready `cat`): PID 1 exits
            #: when it does, so `kill_commands` spares it; read now, before any command ran,
            #: since orphans are reparented to PID 1 later
            self.keep = _children(pid)
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

    def wait(self, timeout_s: float) -> bool:
        """Blocking: whether the process exited within `timeout_s`."""
        if self.pidfd < 0:
            return True
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))

    def open_entry(self) -> list[int]:
        """fds of the sandbox's namespaces, then its root and cwd: verified (see the module
        docstring), so nsenter on them can only enter this sandbox. The caller closes them."""
        fds: list[int] = []
        try:
            for name, _ in NAMESPACES:
                fds.append(os.open(f"/proc/{self.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC))
            for name in ("root", "cwd"):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                fds.append(os.open(f"/proc/{self.pid}/{name}", flags))
        except OSError:
            close_all(fds)
            raise SandboxLostError("the sandbox is gone (its PID 1 exited)") from None
        if not self.alive():
            close_all(fds)
            raise SandboxLostError("the sandbox is gone (its PID 1 exited)")
        return fds

    @staticmethod
    def nsenter_argv(fds: list[int], uid: int, gid: int) -> list[str]:
        """nsenter joining exactly the namespaces, root and cwd held by `fds` (from
        `open_entry`, passed to the child), as `uid`/`gid` of the sandbox, no capabilities."""
        argv = [host_tool("nsenter")]
        argv += [f"{opt}=/proc/self/fd/{fd}" for (_, opt), fd in zip(NAMESPACES, fds, strict=False)]
        root, cwd = fds[len(NAMESPACES)], fds[len(NAMESPACES) + 1]
        argv += [f"--root=/proc/self/fd/{root}", f"--wd=/proc/self/fd/{cwd}"]
        return [*argv, "-S", str(uid), "-G", str(gid), "--"]

    def kill_commands(self, rounds: int = 500) -> int:
        """Blocking: SIGKILL every process of the sandbox's PID namespace but PID 1 and its own
        command, scanning again until a scan finds none alive (a killed process is found again
        until it has exited: a zombie has no namespace left to match), so on return all are
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
                if not entry.isdigit() or int(entry) in spared:
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

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: ask every process for its parent
        found = set()
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = Path(f"/proc/{entry}/stat").read_bytes()
                if int(raw[raw.rfind(b")") + 2 :].split()[1]) == pid:
                    found.add(int(entry))
        return found


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


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
