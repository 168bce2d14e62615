"""How many rollouts fit in the process's file-descriptor limit."""

from __future__ import annotations

import contextlib
import os
import resource

#: File descriptors one rollout in flight may hold: its connection to the target, and with a
#: runtime the sandbox's pipes, pidfd and workdir (bwrap measured at 6).
FDS_PER_ROLLOUT = 2
FDS_PER_SANDBOXED_ROLLOUT = 10
#: Descriptors kept free for everything else: the run directory's files, the event loop, logs.
FD_RESERVE = 64
FD_RAISE_TO = 1 << 16


def fd_concurrency_cap(sandboxed: bool) -> int:
    """How many rollouts may be in flight before the process runs out of file descriptors.

    The soft RLIMIT_NOFILE is first raised to the hard limit (what a user may do without
    privilege); what remains after the descriptors already open and a reserve, divided by a
    rollout's share, is the cap.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        # Not beyond 64 Ki: sandboxes inherit the limit, and some programs walk every fd.
        # (RLIM_INFINITY is -1: min() with it would keep the soft limit where it is)
        want = max(soft, FD_RAISE_TO if hard == resource.RLIM_INFINITY else min(FD_RAISE_TO, hard))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 32
    per = FDS_PER_SANDBOXED_ROLLOUT if sandboxed else FDS_PER_ROLLOUT
    return max(1, (soft - open_now - FD_RESERVE) // per)
