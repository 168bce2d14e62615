"""The bwrap runtime: one bubblewrap sandbox per rollout, alive from `start()` to `stop()`.

`start()` launches `bwrap ... sh` in new user, mount, PID, IPC, UTS, cgroup and network
namespaces (loopback only unless `network`), system directories and a copy of a few `/etc`
files (`bwrap_etc`) bound read-only, the sandbox's root read-only, the rollout's workdir
writable at `/work`, sized tmpfs at `/tmp` and `/dev/shm` (the rest of `/dev` read-only),
`--die-with-parent` and `--new-session`. That `sh` is the sandbox's executor (`bwrap_exec`),
which reads its script from its stdin (`sh -s`) and forks every command. `start()` returns
when it answers the preamble metrale writes first (its rlimits, then "ready"): bwrap's
`--json-status-fd` gives the pid before the uid map is written, so only an answer from inside
means ready.

What holds, and how:

- **No secret of metrale's environment inside, nothing of a command's outside.** bwrap (the
  sandbox's PID 1 is a fork of it) and every host-side wrapper (`setpriv`, `unshare`, when a
  start needs them) are absolute paths from `TRUSTED_PATH` started with `SPAWN_ENV` only; commands
  get `_env()` plus the config's `env` (`--env`, an image's `ENV`) and the call's, exported
  inside the sandbox by the executor's subshell just before the command's `exec`. Nothing
  else of metrale's is in any process inside, and no `PATH`/`LD_*`/`PYTHON*` of an image or
  a task reaches a process on the host.
- **Nothing made inside carries privilege out.** As root, metrale runs bwrap itself as a fresh
  unprivileged host uid per sandbox (`spawn.spawn_as`: no groups, no capabilities), so the
  sandbox user maps to that uid, never to 0: a setuid file made inside is setuid to a uid that
  owns nothing. The workdir and writable binds are handed to that uid (chowned, like podman's
  `:U`); bind sources the uid could not reach (`/root/...` is 0700) are first bound by root
  into the sandbox's private staging dir in a private mount namespace (`unshare --mount`), so
  bwrap needs no access to the host path. Run as a normal user, bwrap maps that user, as ever.
- **Commands run only inside the live sandbox**: the executor, the sandbox's own command,
  forks them (`bwrap_exec`); nothing enters from the host, and a kill inside is checked to be
  in the sandbox's PID namespace (`sandbox_proc`); a dead sandbox (its executor or PID 1 gone)
  raises `SandboxLostError`, recorded on the rollout as `runtime_lost`.
- **File transfer cannot be steered out**: see `beneath` (no symlink followed, ever); nor
  can the seed's copy into the workdir (`bwrap_seed`: an image's WORKDIR resolved inside the
  image, files and directories only, bounded by `seed_max_mb`).
- **Bounded by default**: total memory and processes by a cgroup per sandbox where the host has
  one (`cgroups`), `/tmp` and `/dev/shm` by tmpfs size, CPU time and file size by rlimits.
  `/work` is host disk bounded only per file (RLIMIT_FSIZE); see the README's table.
- **Every exit path stops it**: bwrap dies with metrale (`--die-with-parent`; before bwrap
  has armed it, a dead metrale leaves the executor at EOF, and the sandbox ends by itself;
  the watchdog is the backstop, and kills by the workdir a process's command line names even
  after removing it: a bwrap killed in its first milliseconds leaves a PID 1 that waits for it
  forever, outside the cgroups); `stop()` kills synchronously, and finishes waiting, cgroup
  removal and rmtree even when the awaiting task is cancelled.

Each `run()` is forked inside by the executor, as uid 1000 of the sandbox's user namespace, in
the sandbox's cgroups (PID 1 and the executor are moved there once the executor answers,
before the first command) and under the rlimits the executor set on itself before anything
else ran, so a server started by one command is reachable on loopback by the next.

Where each part lives: the config (`bwrap_config`), the host side of one sandbox and bwrap's
argv (`bwrap_layout`), its life (`bwrap_runtime`), commands and files in it
(`bwrap_commands`), the executor inside it (`bwrap_exec`), the launch helpers
(`bwrap_setup`), the `/etc` copy (`bwrap_etc`), the seed (`bwrap_seed`), the SIGKILL backstop
(`bwrap_watchdog`), a killed run's leftovers (`bwrap_leftovers`). This module is the runtime's
name: the entry point and the names others import.
"""

from typing import TYPE_CHECKING, Any

from metrale.runtime.bwrap_config import FALLBACK_WORKDIR, Bind, BwrapConfig
from metrale.runtime.bwrap_setup import (
    SANDBOX_PATH,
    SANDBOX_UID,
    WORKDIR_PREFIX,
    leftover_cgroups,
    leftover_workdirs,
    system_binds,
)

if TYPE_CHECKING:
    from metrale.runtime.bwrap_runtime import BwrapRuntime, check_bwrap

__all__ = [
    "FALLBACK_WORKDIR", "SANDBOX_PATH", "SANDBOX_UID", "WORKDIR_PREFIX", "Bind", "BwrapConfig",
    "BwrapRuntime", "check_bwrap", "leftover_cgroups", "leftover_workdirs", "system_binds",
]  # fmt: skip

#: loaded on first use: the entry point loads this module for the config alone (the CLI reads
#: every runtime's fields), and the runtime's modules are half of the runtime layer
_RUNTIME_NAMES = ("BwrapRuntime", "check_bwrap")


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        from metrale.runtime import bwrap_runtime

        return getattr(bwrap_runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
