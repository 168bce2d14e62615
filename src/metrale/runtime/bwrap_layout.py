"""What one bwrap sandbox is made of on the host, before bwrap runs: its workdir (filled from
a seed and handed to the sandbox's uid), as root a staging path per bind source and for the
image root (beside the workdir, out of the sandbox's reach), the `/etc` to show, and bwrap's
own argv over them. Blocking: the runtime calls `fill` in a worker thread (`bwrap_runtime`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from metrale.runtime.base import RuntimeStartError
from metrale.runtime.bwrap_etc import etc_view
from metrale.runtime.bwrap_exec import CONTROL, EXECUTOR
from metrale.runtime.bwrap_seed import SeedError, copy_seed, open_in_root
from metrale.runtime.bwrap_setup import (
    SANDBOX_PATH,
    SANDBOX_UID,
    WORKDIR_PREFIX,
    etc_root,
    hand_over,
    privileged,
    stage_dir,
    system_binds,
)
from metrale.runtime.bwrap_watchdog import owner_prefix
from metrale.runtime.procs import host_tool

if TYPE_CHECKING:
    from metrale.runtime.bwrap_config import BwrapConfig

#: bwrap's binds: (source as bwrap reaches it, path inside, writable)
Binds = list[tuple[str, str, bool]]


class Layout(NamedTuple):
    """bwrap's binds, root's staging pairs (host path, staging path), where bwrap reaches the
    image root, and the `/etc` to bind (None when an image brings its own)."""

    binds: Binds
    staging: list[tuple[str, str]]
    root: str | None
    etc: str | None


def fill(
    config: BwrapConfig, workdir: Path, owner: tuple[int, int], tmp: str
) -> tuple[Layout, list[str]]:
    """Fill the sandbox's workdir `workdir` (made empty by the caller): seeded or left empty,
    then owned by `owner` (the sandbox's host uid and gid); as root, the staging paths (in
    `stage_dir`, which the sandbox cannot reach); the `/etc` copy. Returns the layout and
    what the seed's copy skipped."""
    skipped = _seed(config, workdir, owner[0])
    if skipped is None:
        os.chown(workdir, *owner)
    binds: Binds = []
    staging: list[tuple[str, str]] = []
    root = config.root
    stage = stage_dir(workdir)
    if privileged() and (root is not None or config.binds):
        stage.mkdir(mode=0o711)  # refuses whatever is there already (/dev/shm is shared)
        os.chmod(stage, 0o711)
    if root is not None and privileged():
        staged_root = stage / "root"
        staged_root.mkdir()
        staging.append((os.path.abspath(root), str(staged_root)))
        root = str(staged_root)
    for i, bind in enumerate(config.binds):
        src = os.path.abspath(bind.src)
        if not os.path.lexists(src):
            raise RuntimeStartError(f"bind source {src} does not exist")
        if privileged():
            if bind.writable:
                hand_over(Path(src), owner[0])
            staged = stage / str(i)
            if os.path.isdir(src):
                staged.mkdir()
            else:
                staged.touch()
            staging.append((src, str(staged)))
            src = str(staged)
        binds.append((src, bind.dst or bind.src, bind.writable))
    # an image brings its own /etc
    etc = None if config.root is not None else etc_view(etc_root(tmp), owner_prefix(WORKDIR_PREFIX))
    return Layout(binds, staging, root, etc), skipped or []


def _seed(config: BwrapConfig, workdir: Path, uid: int) -> list[str] | None:
    """Fill the workdir from the seed (`bwrap_seed`: no link followed on the host, only
    files and directories, bounded) and hand it to `uid`; what the copy skipped, or None when
    there is nothing to copy."""
    try:
        if config.seed_from_root and config.root is not None:
            src_fd = open_in_root(config.root, config.workdir)
        elif config.seed is not None:
            src_fd = os.open(config.seed, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            return None
        if src_fd is None:  # a WORKDIR the image lacks: empty, as docker makes it
            return None
        try:
            seeded = copy_seed(src_fd, workdir, config.seed_max_mb << 20)
        finally:
            os.close(src_fd)
    except SeedError as exc:
        raise RuntimeStartError(str(exc)) from exc
    hand_over(workdir, uid)
    return seeded.skipped


def _tmpfs(path: str, size_mb: int | None) -> list[str]:
    size = ["--size", str(size_mb << 20)] if size_mb else []
    return [*size, "--tmpfs", path]


def bwrap_argv(
    config: BwrapConfig,
    host_workdir: Path,
    status_fd: int,
    layout: Layout,
    *,
    control: Path,
) -> list[str]:
    """bwrap's argv: `layout.root` is where bwrap reaches `config.root` (its staging path, as
    root); `layout.etc` the directory shown at `/etc` when there is no image root; `control`
    the executor's control directory, bound read-only at `CONTROL`."""
    cfg = config
    argv = [host_tool("bwrap"), "--unshare-all", "--unshare-user"]
    if cfg.network:
        argv.append("--share-net")
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += system_binds(cfg.root, layout.root, layout.etc)
    # /dev: bwrap's device nodes, read-only but for a sized /dev/shm; /tmp sized too
    argv += ["--proc", "/proc", "--dev", "/dev", *_tmpfs("/dev/shm", cfg.shm_mb)]
    argv += ["--remount-ro", "/dev", *_tmpfs("/tmp", cfg.tmp_mb)]
    for path in cfg.scratch:
        argv += _tmpfs(path, cfg.tmp_mb)
    argv += ["--bind", str(host_workdir), cfg.workdir]
    argv += ["--ro-bind", str(control), CONTROL]
    for src, dst, writable in layout.binds:
        argv += ["--bind" if writable else "--ro-bind", src, dst]
    # the sandbox's own root (a tmpfs holding the mount points) is read-only too: only the
    # workdir, /tmp, /dev/shm and writable binds take writes
    argv += ["--remount-ro", "/"]
    argv += ["--chdir", cfg.workdir, "--clearenv", "--setenv", "PATH", SANDBOX_PATH]
    # bwrap reports the pid before it writes the uid map: "ready" from inside, answered by
    # the executor (the sandbox's own command, which forks every command), means it runs
    argv += ["--json-status-fd", str(status_fd), "--", *EXECUTOR]
    return argv
