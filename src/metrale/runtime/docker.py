"""The docker runtime: one container per rollout through any docker-compatible CLI (the docker
CLI against dockerd or against podman's Docker-API socket, or podman itself).

`start()` is `run -d --init` of the image with `sleep infinity` under a tiny init that reaps
what commands leave behind (with `sleep` as PID 1, finished children count against
`--pids-limit` until no exec can start). Network `none`, memory, swap, pids and CPU limits, no
new privileges and a reduced capability set by default; a user namespace of its own, so root
inside is an unprivileged uid outside (on podman, `USERNS_AUTO`, below; against dockerd, the
daemon's `userns-remap`, which metrale neither sets nor checks). Only `config.env`
and the runtime's minimal env go in, always as `-e NAME=VALUE`: metrale's own environment
never reaches the container. `run()` is `exec`, wrapped in the image's `timeout` so a command
that outlives its limit is killed inside the container, not only its client.
`read()`/`write()` are `cp` of a tar stream (binary-safe, resolved by the engine inside the
container's root, no exec session).
`stop()` removes without waiting (`rm -f`; podman's CLI needs `-t 0` or waits 10 s).

On a podman engine every container is created by podman's own client (the podman CLI, or
`podman --remote` through the docker CLI's socket: `container_creator`) with a sized `auto`
user namespace (`USERNS_AUTO`). Unsized, podman 4.3 (Debian 12's) sizes each namespace by
mounting a temporary layer of the image while it holds the layer store's lock, the inverse of
the order every mount and every podman process's shutdown takes the same two locks, and under
concurrent rollouts the whole engine deadlocks: every client hangs (containers/storage PR 1387,
fixed in 1.44). The docker CLI accepts no such mode, and podman 4.3's Docker API drops the size
containers.conf gives; podman's client sends it. `--http-proxy=false`: podman's client would
copy metrale's proxy variables (with their credentials) into the container.

Containers carry the `metrale.sandbox` label with the owning pid and host. A watchdog, one per
metrale process, removes that process's containers when it dies (SIGKILL included), and
`metrale cleanup` removes what is left of runs on this host that are no longer alive.

podman keeps two conmon processes per exec session alive for `exit_command_delay` seconds so an
API client can read the exit code; scripts/container-engine.sh sets 5 s (default 300), which
bounds them to the execs of the last few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import posixpath
import shlex
import shutil
import socket
import subprocess
import tarfile
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from metrale.bounds import CPUS, MAX_PROCS, MEMORY_MB, pydantic_range
from metrale.errors import UsageError
from metrale.runtime import procs
from metrale.runtime.base import (
    LIMIT_KEYS,
    Capability,
    CleanupReport,
    ProgramResult,
    Runtime,
    RuntimeBase,
    RuntimeConfig,
    RuntimeStartError,
    TaskSandbox,
    Throttle,
    unknown_options,
)
from metrale.runtime.procs import killpg, run_process, spawned

#: The docker runtime's image: built offline by `bash scripts/container-engine.sh up`.
DEFAULT_IMAGE = "metrale/base:bookworm"
ENGINE_UP = "bash scripts/container-engine.sh up"
LABEL = "metrale.sandbox"
PID_LABEL = f"{LABEL}.pid"
HOST_LABEL = f"{LABEL}.host"
#: Seconds past a command's timeout before its `docker exec` client is killed as well.
CLIENT_GRACE_S = 5.0
#: What every container's processes get besides `config.env`: the image's PATH may be absent
#: (an imported rootfs has none), and nothing of metrale's environment goes in.
MINIMAL_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
#: Capabilities kept (the rest dropped): enough for package tools and servers inside.
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
#: How each exec enters its directory ($0) before it runs the command ("$@"); the workdir
#: ($1 of the format) is made first if the entry command has not made it yet.
ENTER = 'mkdir -p -- {workdir} 2>/dev/null; cd -- "$0" && exec "$@"'
#: Largest file `read()` returns.
READ_CAP_BYTES = 1 << 30
#: How long a `read()` may take (a FIFO or a stalled engine must not hold a rollout forever).
READ_TIMEOUT_S = 300.0
#: `kill_commands`, as root inside. The entry command (`sleep infinity`) must live: when PID 1
#: is an init (`--init`), the entry is its earliest-started child (an orphan reparented to it
#: started later, with an exec); when PID 1 is `sleep` itself, no other process is spared.
#: Then every process but PID 1, the entry and this shell is stopped in one sweep of the
#: kernel (`kill -STOP -1`, which no fork escapes), each one killed, and the entry resumed.
#: Builtins only (`read`, `kill`): a child of this shell would be caught by its own sweep.
KILL_COMMANDS = r"""
entry= first=
read -r init < /proc/1/comm
if [ "$init" != sleep ]; then
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue
    read -r s 2>/dev/null < "$d/stat" || continue
    s=${s##*) }; set -- $s
    [ "$2" = 1 ] || continue
    if [ -z "$first" ] || [ "${20}" -lt "$first" ]; then entry=$p first=${20}; fi
  done
fi
kill -s STOP -1 2>/dev/null
[ -n "$entry" ] && kill -s CONT "$entry" 2>/dev/null
for d in /proc/[0-9]*; do
  p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || [ "$p" = "$entry" ] && continue
  kill -s KILL "$p" 2>/dev/null
done
exit 0
"""


def is_podman(cli: str) -> bool:
    return Path(cli).name.startswith("podman")


#: Each container's user namespace on podman: its own, of a fixed size (why: the docstring).
USERNS_AUTO = "--userns=auto:size=65536"
#: What `version` prints: the server's version, then its components (podman's: Podman Engine).
VERSION_FORMAT = "{{.Server.Version}} {{range .Server.Components}}{{.Name}};{{end}}"
_VERSIONS: dict[tuple[str, str], str] = {}
_CREATORS: dict[tuple[str, str], tuple[str, ...]] = {}


def engine_version(cli: str) -> subprocess.CompletedProcess[str]:
    """Blocking: `cli version` in `VERSION_FORMAT`, asked once per CLI and DOCKER_HOST when the
    engine answers (the run's check and its first sandbox share it)."""
    key = (cli, os.environ.get("DOCKER_HOST", ""))
    argv = [cli, "version", "--format", VERSION_FORMAT]
    if key in _VERSIONS:
        return subprocess.CompletedProcess(argv, 0, _VERSIONS[key], "")
    probe = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode == 0 and probe.stdout.strip():
        _VERSIONS[key] = probe.stdout
    return probe


def container_creator(cli: str) -> tuple[str, ...]:
    """Blocking, once per CLI and DOCKER_HOST: the command that creates this process's
    containers. `cli` itself, unless it is a docker CLI in front of a podman engine and a podman
    client is on PATH: then `podman --remote --url <the docker CLI's endpoint>`. An engine that
    does not answer is not remembered (the run's own calls then say why)."""
    key = (cli, os.environ.get("DOCKER_HOST", ""))
    if key in _CREATORS:
        return _CREATORS[key]
    podman = shutil.which("podman")
    if is_podman(cli) or podman is None:
        return _CREATORS.setdefault(key, (cli,))
    where = [cli, "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"]
    try:
        engine = engine_version(cli)
        if engine.returncode != 0:
            return (cli,)
        host = subprocess.run(where, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return (cli,)
    endpoint = host.stdout.strip()
    remote = "Podman Engine" in engine.stdout and host.returncode == 0 and endpoint
    return _CREATORS.setdefault(key, (podman, "--remote", "--url", endpoint) if remote else (cli,))


class DockerRuntime(RuntimeBase):
    config: DockerConfig

    def __init__(self, config: DockerConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.name = f"metrale-{uuid.uuid4().hex[:16]}"
        self.container: str | None = None
        self._stopped = False
        self._removal: asyncio.Task[None] | None = None

    def run_argv(self, creator: Sequence[str] = ()) -> list[str]:
        """`run -d` of this runtime's container by `creator` (`container_creator`; the
        configured CLI when empty)."""
        cfg = self.config
        argv = [*(creator or [cfg.cli]), "run", "-d", "--rm", "--init", "--pull", "never"]
        argv += ["--name", self.name]
        argv += ["--label", f"{LABEL}=1", "--label", f"{PID_LABEL}={os.getpid()}"]
        argv += ["--label", f"{HOST_LABEL}={socket.gethostname()}", "--network", cfg.network]
        if cfg.cpus is not None:
            argv += ["--cpus", str(cfg.cpus)]
        if cfg.memory_mb is not None:
            # swap as large as memory: the limit is on RAM + swap, not RAM alone
            argv += ["--memory", f"{cfg.memory_mb}m", "--memory-swap", f"{cfg.memory_mb}m"]
        if cfg.max_procs is not None:
            argv += ["--pids-limit", str(cfg.max_procs)]
        argv += ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
        if is_podman(argv[0]):
            # root inside is a subordinate uid outside; a docker CLI (which accepts no such
            # mode) in front of another engine gets that engine's own setting
            argv += [USERNS_AUTO, "--http-proxy=false"]
        for cap in CAPABILITIES:
            argv += ["--cap-add", cap]
        for key, value in {**MINIMAL_ENV, **cfg.env}.items():
            argv += ["-e", f"{key}={value}"]
        # no --workdir: podman's CLI refuses one the image lacks; each exec enters it instead
        argv += ["--entrypoint", "sh", cfg.image]
        argv += ["-c", f"mkdir -p {shlex.quote(cfg.workdir)} && exec sleep infinity"]
        return argv

    async def _cli(
        self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ProgramResult:
        return await run_process(
            argv,
            env=os.environ,  # for the CLI (DOCKER_HOST, CONTAINERS_CONF); the container gets -e
            cwd=None,
            timeout=timeout,
            cap=self.config.output_cap_bytes,
            stdin=stdin,
        )

    async def start(self) -> None:
        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        ensure_watchdog(self.config.cli)
        try:
            creator = await asyncio.to_thread(container_creator, self.config.cli)
            result = await self._cli(self.run_argv(creator), timeout=600)
        except OSError as exc:
            raise RuntimeStartError(f"cannot run {self.config.cli}: {exc}") from exc
        if result.exit_code != 0:
            why = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
            raise RuntimeStartError(f"{self.config.cli} run failed: {why[:300]}")
        self.container = result.stdout.strip().splitlines()[-1] if result.stdout else self.name

    def _path(self, path: str) -> str:
        """An absolute, normalised path inside the container (relative: under the workdir)."""
        full = path if path.startswith("/") else f"{self.config.workdir}/{path}"
        return posixpath.normpath(full)

    def _exec_argv(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> list[str]:
        if self.container is None or self._stopped:
            raise RuntimeError("docker runtime is not started")
        out = [self.config.cli, "exec"]
        for key, value in (env or {}).items():
            out += ["-e", f"{key}={value}"]
        out.append(self.container)
        if timeout is not None:
            out += ["timeout", "-s", "KILL", str(timeout)]
        # `cd` inside rather than `exec -w`: the same with every CLI, and the workdir is made
        # by the container's entry command, which may still be running at the first exec
        where = self._path(cwd or self.config.workdir)
        enter = ENTER.format(workdir=shlex.quote(self.config.workdir))
        return [*out, "sh", "-c", enter, where, *argv]

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        client_timeout = None if timeout is None else timeout + CLIENT_GRACE_S
        result = await self._cli(self._exec_argv(argv, env, cwd, timeout), timeout=client_timeout)
        if timeout is not None and result.exit_code in (124, 137) and result.duration_s >= timeout:
            result.timed_out, result.exit_code = True, 124
        return result

    async def kill_commands(self) -> None:
        """Every process of the container but its init and entry command (see
        `KILL_COMMANDS`), killed as root inside the container's PID namespace."""
        if self.container is None or self._stopped:
            raise RuntimeError("docker runtime is not started")
        argv = [self.config.cli, "exec", "-u", "0", self.container, "sh", "-c", KILL_COMMANDS]
        result = await self._cli(argv, timeout=120)
        if result.exit_code != 0:
            why = (result.stderr.strip() or f"exit {result.exit_code}")[:300]
            raise OSError(f"cannot kill the container's commands: {why}")

    async def read(self, path: str) -> bytes:
        """The regular file `path`: the `cp` tar stream is read as it comes, and refused at its
        header when the member is no regular file or larger than `READ_CAP_BYTES`, so a 3 GB
        sparse file is never buffered; the whole read is bounded by `READ_TIMEOUT_S`."""
        if self.container is None or self._stopped:
            raise RuntimeError("docker runtime is not started")
        argv = [self.config.cli, "cp", f"{self.container}:{self._path(path)}", "-"]
        return await asyncio.to_thread(read_member, argv, path, READ_CAP_BYTES, READ_TIMEOUT_S)

    async def write(self, path: str, data: bytes | str) -> None:
        if self.container is None or self._stopped:
            raise RuntimeError("docker runtime is not started")
        payload = data.encode() if isinstance(data, str) else data
        full = self._path(path)
        # one member named by its whole path, extracted at /: the engine creates the parents
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as archive:
            info = tarfile.TarInfo(full.lstrip("/"))
            info.size, info.mode = len(payload), 0o644
            archive.addfile(info, io.BytesIO(payload))
        argv = [self.config.cli, "cp", "-", f"{self.container}:/"]
        code, _, err = await run_bytes(argv, stdin=buf.getvalue())
        if code != 0:
            raise OSError(f"cannot write {path} in the container: {err.strip()[:300]}")

    async def stop(self) -> None:
        """Removes the container; a cancellation while it is removed waits for the removal
        to finish (a half-stopped sandbox would outlive the run), then propagates."""
        if self._removal is None:
            self._stopped = True
            self._removal = asyncio.ensure_future(self._remove())
        cancelled = False
        while not self._removal.done():
            try:
                await asyncio.shield(self._removal)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    async def _remove(self) -> None:
        # by name: a container whose `run -d` was interrupted still goes
        argv = [self.config.cli, "rm", "-f"]
        if is_podman(self.config.cli):
            argv += ["-t", "0"]
        with contextlib.suppress(OSError):
            await self._cli([*argv, self.name], timeout=120)


def read_member(argv: Sequence[str], path: str, cap: int, timeout_s: float) -> bytes:
    """Blocking: the first member of the tar stream `argv` prints, if it is a regular file of
    at most `cap` bytes; FileNotFoundError (with the true reason) otherwise. The CLI is killed
    when the member is refused, and after `timeout_s` whatever it is doing."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timer = threading.Timer(timeout_s, killpg, (proc.pid,))
    timer.start()
    assert proc.stdout is not None and proc.stderr is not None
    try:
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                # the first member is the path itself: a directory or a link is no file
                member = archive.next()
                if member is not None and not member.isfile():
                    raise FileNotFoundError(f"{path}: not a regular file")
                if member is not None and member.size > cap:
                    raise FileNotFoundError(f"{path}: larger than {cap} bytes ({member.size})")
                handle = archive.extractfile(member) if member is not None else None
                if handle is not None:
                    return handle.read(cap + 1)[:cap]
        except tarfile.TarError:
            pass
        killpg(proc.pid)
        proc.wait()
        if not timer.is_alive():
            raise FileNotFoundError(f"{path}: not read within {timeout_s:g} s")
        err = proc.stderr.read(4096).decode(errors="replace").strip()
        if not err:  # the engine copied nothing it calls a file (a link to a device, ...)
            raise FileNotFoundError(f"{path}: not a regular file (the engine's copy held none)")
        raise FileNotFoundError(f"{path}: {err[:300]}")
    finally:
        timer.cancel()
        killpg(proc.pid)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


async def run_bytes(
    argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 300
) -> tuple[int, bytes, str]:
    """(exit code, stdout bytes, stderr text) of a CLI call whose output is data, not text;
    killed with its process group on timeout or cancellation."""
    proc = await spawned(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ),
        lambda p: p.pid,
        lambda p: None,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except BaseException:
        killpg(proc.pid)
        with contextlib.suppress(Exception):
            await proc.wait()
        raise
    if len(out) > READ_CAP_BYTES + (1 << 20):
        return 1, b"", "file larger than 1 GiB"
    return proc.returncode or 0, out, err.decode(errors="replace")


#: The watchdog's program: wait for the owning process to die (a pidfd, so a reused pid is
#: never mistaken for it), then remove that process's labelled containers, twice, since a
#: `run -d` in flight at the kill may create one after the first sweep.
_WATCHDOG = """
import os, select, subprocess, sys, time
cli, pid, host = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    fd = os.pidfd_open(pid)
    select.select([fd], [], [])
except (OSError, AttributeError):
    while os.path.exists(f"/proc/{pid}"):
        time.sleep(0.5)
rm = [cli, "rm", "-f"] + (["-t", "0"] if os.path.basename(cli).startswith("podman") else [])
for delay in (0, 2, 5):
    time.sleep(delay)
    ids = subprocess.run(
        [cli, "ps", "-aq", "--filter", f"label=metrale.sandbox.pid={pid}",
         "--filter", f"label=metrale.sandbox.host={host}"],
        capture_output=True, text=True, timeout=120,
    ).stdout.split()
    if ids:
        subprocess.run(rm + ids, capture_output=True, timeout=300)
"""


def ensure_watchdog(cli: str) -> None:
    """This process's watchdog for the containers it starts with `cli`, once. The docker CLI
    keeps the host's environment (DOCKER_HOST, registry credentials): it is not in a sandbox."""
    procs.ensure_watchdog(
        ("docker", cli),
        _WATCHDOG,
        [cli, str(os.getpid()), socket.gethostname()],
        {**os.environ, "METRALE_DOCKER_WATCHDOG": str(os.getpid())},
    )


class DockerConfig(RuntimeConfig):
    """A container from any docker-compatible CLI, kept alive with `sleep infinity` under
    `--init`. The default image is the one scripts/container-engine.sh builds from Debian's
    packages (no registry needed); images are never pulled during a run."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.TASK_IMAGE,
            Capability.NETWORK_OFF,
            Capability.NETWORK,
            Capability.BOUNDS,
            Capability.LEFTOVERS,
            Capability.KILL_COMMANDS,
        }
    )
    type: Literal["docker"] = "docker"
    image: str = DEFAULT_IMAGE
    cli: str = Field(default="docker", description="the container CLI to use (docker, podman)")
    network: str = Field(default="none", description="none (default), bridge, host, ...")
    cpus: float | None = Field(
        default=1.0, description="CPUs of the container (--cpus)", **pydantic_range(CPUS)
    )
    memory_mb: int | None = Field(
        default=2048, description="RAM + swap of the container", **pydantic_range(MEMORY_MB)
    )
    max_procs: int | None = Field(
        default=256, description="--pids-limit", **pydantic_range(MAX_PROCS)
    )
    workdir: str = Field(default="/work", pattern="^/", description="the workdir inside")
    env: dict[str, str] = Field(default_factory=dict)

    def create(self, throttle: Throttle | None = None) -> Runtime:
        return DockerRuntime(self, throttle)

    def check(self) -> None:
        check_docker(self)

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`memory_mb` and `max_procs` are the container's own fields; other limits are not."""
        limits = [k for k in LIMIT_KEYS if k in options and k not in cls.model_fields]
        if limits:
            unknown_options(cls, {k: options[k] for k in limits})
        return super().from_flat(options)

    @classmethod
    def flat_keys(cls) -> list[str]:
        return [k for k in cls.model_fields if k != "type"]

    def image_form(self) -> str | None:
        return "tag"

    def for_task(self, task: TaskSandbox) -> RuntimeConfig:
        """The task's image with its WORKDIR and ENV (the user's `--env` on top), task.toml's
        CPUs and memory, and the network its `allow_internet` says (`task_network`)."""
        update: dict[str, Any] = {}
        if task.image is not None:
            update.update(image=task.image, workdir=task.workdir or "/",
                          env={**task.env, **self.env})  # fmt: skip
        if task.cpus is not None:
            update["cpus"] = task.cpus
        if task.memory_mb is not None:
            update["memory_mb"] = task.memory_mb
        update["network"] = task_network(self.network, internet=task.internet)
        return self.model_copy(update=update)

    def cleanup(self, report: CleanupReport, *, everything: bool = False) -> None:
        clean_containers(self.cli, report, everything=everything)


#: The network a task that allows the internet gets when `--docker-network` names none: the
#: engine's default bridge (podman's own default network through its Docker API or CLI).
TASK_NETWORK = "bridge"


def task_network(network: str, *, internet: bool) -> str:
    """A task's network, exactly as its `allow_internet` says whatever the flags: none when it
    does not allow the internet; when it does, the network `--docker-network` names, or
    `TASK_NETWORK` when that is `none` (the default, meant for sandboxes that need none)."""
    if not internet:
        return "none"
    return TASK_NETWORK if network == "none" else network


def _engine_probe(
    what: str, ask: Callable[[], subprocess.CompletedProcess[str]]
) -> subprocess.CompletedProcess[str]:
    try:
        return ask()
    except subprocess.TimeoutExpired:
        raise UsageError(f"docker runtime: '{what}' did not answer in 30 s") from None
    except OSError as exc:
        raise UsageError(f"docker runtime: cannot run '{what}': {exc}") from None


def check_docker(config: DockerConfig) -> None:
    """The CLI exists, an engine answers it, and the image is there (never pulled mid-run:
    64 rollouts would pull it 64 times, timed as setup). Each failure names the fix."""
    cli = config.cli
    if shutil.which(cli) is None:
        raise UsageError(
            f"docker runtime: {cli!r} is not on PATH (pick one with --docker-cli); "
            f"to install and start an engine: {ENGINE_UP}"
        )
    probe = _engine_probe(f"{cli} version", lambda: engine_version(cli))
    if probe.returncode != 0 or not probe.stdout.strip():
        where = os.environ.get("DOCKER_HOST", "the default socket")
        why = (probe.stderr.strip().splitlines() or ["no engine"])[-1][:200]
        raise UsageError(
            f"docker runtime: no container engine answers {cli!r} at {where} ({why}); "
            f'start one with: eval "$({ENGINE_UP})"'
        )
    inspect = [cli, "image", "inspect", config.image]
    image = _engine_probe(
        f"{cli} image inspect",
        lambda: subprocess.run(inspect, capture_output=True, text=True, timeout=30, check=False),
    )
    if image.returncode != 0:
        hint = (
            f"build it with: {ENGINE_UP}"
            if config.image == DEFAULT_IMAGE
            else f"'{cli} pull {config.image}' or build it first"
        )
        raise UsageError(f"docker runtime: image {config.image!r} is not in the engine; {hint}")


def clean_containers(cli: str, report: CleanupReport, *, everything: bool = False) -> None:
    if shutil.which(cli) is None:
        report.notes.append(f"docker: {cli!r} not on PATH, no containers to look at")
        return
    try:
        listing = subprocess.run(
            [cli, "ps", "-aq", "--filter", f"label={LABEL}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        report.notes.append(f"docker: '{cli} ps' did not answer in 60 s, containers not checked")
        return
    if listing.returncode != 0:
        why = (listing.stderr.strip().splitlines() or ["no engine"])[-1][:200]
        report.notes.append(f"docker: no engine answers {cli!r} ({why}), containers not checked")
        return
    ids = listing.stdout.split()
    if not ids:
        return
    fmt = f'{{{{.Id}}}} {{{{index .Config.Labels "{PID_LABEL}"}}}} '
    fmt += f'{{{{index .Config.Labels "{HOST_LABEL}"}}}} {{{{.Name}}}}'
    inspect = subprocess.run(
        [cli, "inspect", "--format", fmt, *ids], capture_output=True, text=True, timeout=120
    )
    here = socket.gethostname()
    doomed = []
    for line in inspect.stdout.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        cid, pid, host, name = parts[0], parts[1], parts[2], parts[3].lstrip("/")
        if not everything and host != here:
            report.kept.append(f"container {name} (made on host {host}; --all removes it)")
        elif not everything and _pid_alive(pid):
            report.kept.append(f"container {name} (its run, pid {pid}, is alive)")
        else:
            doomed.append((cid, name))
    if doomed:
        rm = [cli, "rm", "-f", *(["-t", "0"] if is_podman(cli) else [])]
        subprocess.run([*rm, *(c for c, _ in doomed)], capture_output=True, timeout=300)
        report.removed += [f"container {name}" for _, name in doomed]


def _pid_alive(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()
