"""The bwrap runtime: one bubblewrap sandbox per rollout, alive from `start()` to `stop()`.

`start()` launches `bwrap ... cat` in new user, mount, PID, IPC, UTS, cgroup and network
namespaces (loopback only unless `network`), system directories and a few `/etc` files bound
read-only, the sandbox's root read-only, the rollout's workdir writable at `/work`, a private
`/tmp`, `--die-with-parent` and `--new-session`, under `setpriv --pdeathsig KILL` so bwrap dies
with metrale. It returns when `cat` inside echoes the line fed to it: bwrap's `--json-status-fd`
gives the pid before the uid map is written, so only an answer from inside means ready.

Each `run()` enters those namespaces with `nsenter` as uid 1000 of the sandbox's user namespace
(mapped to the invoking host user, no capabilities), under `prlimit` limits, so a server started
by one command is reachable on loopback by the next. The process limit is a `pids` cgroup per
sandbox where the host lets us create one (RLIMIT_NPROC exempts a root-mapped uid). `stop()`
kills bwrap: the sandbox's PID 1 dies with it and the kernel kills everything left in its PID
namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale.errors import UsageError
from metrale.runtime.base import ProgramResult, RuntimeBase, RuntimeStartError, Throttle
from metrale.runtime.configs import BwrapConfig
from metrale.runtime.procs import PidsCgroup, killpg, run_process

#: The uid and gid commands run as inside the sandbox (mapped to the invoking host user).
SANDBOX_UID = 1000
#: Top-level system directories bound read-only (or re-created as the same symlink).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt/conda")
#: /etc entries a program commonly needs; nothing else of the host's /etc is visible.
ETC_FILES = (
    "alternatives", "ca-certificates", "ssl", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "localtime", "nsswitch.conf", "hosts", "resolv.conf", "passwd", "group", "python3",
    "mime.types", "protocols", "services", "os-release", "debian_version",
)  # fmt: skip
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_TIMEOUT_S = 60.0
#: The sandbox's command: `cat` echoes the "ready" line we feed it once the sandbox runs, then
#: blocks on its stdin, which we hold open until `stop()` (or until metrale dies).
READY_COMMAND = ("cat",)


def check_bwrap(config: BwrapConfig | None = None) -> None:
    """UsageError when bubblewrap is missing, cannot create namespaces, or a bind is absent."""
    for tool, package in (("bwrap", "bubblewrap"), ("nsenter", "util-linux"),
                          ("prlimit", "util-linux")):  # fmt: skip
        if shutil.which(tool) is None:
            raise UsageError(
                f"bwrap runtime: '{tool}' is not installed (Debian/Ubuntu: apt-get install "
                f"{package})"
            )
    probe = subprocess.run(
        ["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        raise UsageError(
            f"bwrap runtime: bubblewrap cannot create a sandbox here ({why}); user namespaces "
            "may be disallowed (sysctl kernel.unprivileged_userns_clone=1, "
            "user.max_user_namespaces > 0, or an AppArmor userns restriction)"
        )
    for bind in config.binds if config is not None else ():
        if not os.path.exists(bind.src):
            raise UsageError(f"bwrap runtime: bind source {bind.src} does not exist")


def system_binds() -> list[str]:
    """bwrap arguments that show the host's system directories read-only, as they are laid
    out here (merged-/usr symlinks stay symlinks)."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in ETC_FILES:
        host = Path("/etc") / name
        if host.exists():
            args += ["--ro-bind", str(host), str(host)]
    return args


class BwrapRuntime(RuntimeBase):
    config: BwrapConfig

    def __init__(self, config: BwrapConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.workdir: Path | None = None
        self.sandbox_pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        #: one set per command in flight, holding its process group id while it runs
        self._running: list[set[int]] = []
        self._stopped = False
        self._cgroup: PidsCgroup | None = None

    def bwrap_argv(self, workdir: Path, status_fd: int) -> list[str]:
        cfg = self.config
        argv = ["bwrap", "--unshare-all", "--unshare-user"]
        if cfg.network:
            argv.append("--share-net")
        argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        argv += system_binds()
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        argv += ["--bind", str(workdir), cfg.workdir]
        for bind in cfg.binds:
            argv += ["--bind" if bind.writable else "--ro-bind", bind.src, bind.dst or bind.src]
        # the sandbox's own root (a tmpfs holding the mount points) is read-only too: only the
        # workdir, /tmp and writable binds take writes
        argv += ["--remount-ro", "/"]
        argv += ["--chdir", cfg.workdir, "--clearenv", "--setenv", "PATH", SANDBOX_PATH]
        # bwrap reports the pid before it writes the uid map: "ready" echoed from inside is
        # the signal that commands can enter
        argv += ["--json-status-fd", str(status_fd), "--", *READY_COMMAND]
        return argv

    async def start(self) -> None:
        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix="metrale-bwrap-"))
        except OSError as exc:
            raise RuntimeStartError(f"cannot create a workdir: {exc}") from exc
        read_fd, write_fd = os.pipe()
        argv = self.bwrap_argv(self.workdir, write_fd)
        if shutil.which("setpriv"):
            # --die-with-parent ties the sandbox to bwrap; this ties bwrap to us, so a metrale
            # killed with SIGKILL leaves no sandbox running either
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        if self.config.limits.max_procs is not None:
            self._cgroup = PidsCgroup.create(self.workdir.name, self.config.limits.max_procs)
            if self._cgroup is not None:
                argv = self._cgroup.wrap(argv)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            raise RuntimeStartError(f"cannot run bwrap: {exc}") from exc
        finally:
            os.close(write_fd)
        assert self._proc.stdin is not None
        self._proc.stdin.write(b"ready\n")
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        ready = b""
        try:
            line = await asyncio.wait_for(reader.readline(), READY_TIMEOUT_S)
            assert self._proc.stdout is not None
            ready = await asyncio.wait_for(self._proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        finally:
            transport.close()
        try:
            self.sandbox_pid = int(json.loads(line)["child-pid"])
        except (ValueError, KeyError, TypeError):
            self.sandbox_pid = None
        if self.sandbox_pid is None or ready != b"ready\n":
            why = await self._failure_text()
            raise RuntimeStartError(f"bwrap did not start: {why}")

    async def _failure_text(self) -> str:
        assert self._proc is not None
        killpg(self._proc.pid)
        stderr = b""
        if self._proc.stderr is not None:
            with contextlib.suppress(TimeoutError):
                stderr = await asyncio.wait_for(self._proc.stderr.read(4096), 5)
        text = stderr.decode(errors="replace").strip()
        return text.splitlines()[-1] if text else f"exit {self._proc.returncode}"

    def _enter(self, argv: Sequence[str], cwd: str | None) -> list[str]:
        if self.sandbox_pid is None or self._stopped:
            raise RuntimeError("bwrap runtime is not started")
        if cwd:
            argv = ["sh", "-c", 'cd -- "$0" && exec "$@"', cwd, *argv]
        uid = str(SANDBOX_UID)
        enter = self._cgroup.wrap([]) if self._cgroup is not None else []
        return [
            *enter,
            *self.config.limits.prlimit_argv(),
            "nsenter", "-t", str(self.sandbox_pid), "--all", "-r", "-w",
            "-S", uid, "-G", uid, "--", *argv,
        ]  # fmt: skip

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": self.config.workdir,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
        }
        env.update(self.config.env)
        env.update(extra or {})
        return env

    async def _exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        cap: int | None = None,
    ) -> ProgramResult:
        running: set[int] = set()
        self._running.append(running)
        try:
            return await run_process(
                self._enter(argv, cwd),
                env=self._env(env),
                cwd=None,
                timeout=timeout,
                cap=cap or self.config.output_cap_bytes,
                stdin=stdin,
                sessions=running,
            )
        finally:
            self._running.remove(running)

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return await self._exec(argv, env=env, cwd=cwd, timeout=timeout)

    def _host_path(self, path: str) -> Path | None:
        """The host path of a sandbox path inside the workdir, or None when it is elsewhere or
        resolves (through a symlink the sandbox made) outside the workdir."""
        if self.workdir is None:
            raise RuntimeError("bwrap runtime is not started")
        inside = os.path.normpath(os.path.join(self.config.workdir, path))
        root = self.config.workdir.rstrip("/")
        if inside != root and not inside.startswith(root + "/"):
            return None
        host = self.workdir / os.path.relpath(inside, root)
        real_root = os.path.realpath(self.workdir)
        real = os.path.realpath(host)
        if real != real_root and not real.startswith(real_root + os.sep):
            return None
        return host

    async def read(self, path: str) -> bytes:
        host = self._host_path(path)
        if host is not None and not host.is_symlink():
            return await asyncio.to_thread(host.read_bytes)
        result = await self._exec(["cat", "--", path], cap=1 << 30)
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path}: {result.stderr.strip()}")
        return result.stdout.encode()

    async def write(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        host = self._host_path(path)
        if host is not None and not host.is_symlink():

            def put() -> None:
                host.parent.mkdir(parents=True, exist_ok=True)
                host.write_bytes(payload)

            await asyncio.to_thread(put)
            return
        result = await self._exec(
            ["sh", "-c", 'mkdir -p -- "$(dirname -- "$0")" && cat > "$0"', path], stdin=payload
        )
        if result.exit_code != 0:
            raise OSError(f"cannot write {path} in the sandbox: {result.stderr.strip()}")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for running in list(self._running):
            for pgid in running:
                killpg(pgid)
        if self._proc is not None:
            if self._proc.returncode is None:
                killpg(self._proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._proc.wait(), 10)
            if self._proc.stderr is not None:
                transport = getattr(self._proc, "_transport", None)
                if transport is not None:
                    transport.close()
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)
        if self.workdir is not None:
            await asyncio.to_thread(shutil.rmtree, self.workdir, True)
