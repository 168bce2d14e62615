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
import os
import select
from pathlib import Path

from metrale.runtime.base import SandboxLostError

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
        argv = ["nsenter"]
        argv += [f"{opt}=/proc/self/fd/{fd}" for (_, opt), fd in zip(NAMESPACES, fds, strict=False)]
        root, cwd = fds[len(NAMESPACES)], fds[len(NAMESPACES) + 1]
        argv += [f"--root=/proc/self/fd/{root}", f"--wd=/proc/self/fd/{cwd}"]
        return [*argv, "-S", str(uid), "-G", str(gid), "--"]

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
