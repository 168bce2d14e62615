"""The runtime flags (which runtime, its limits and binds) and the RuntimeConfig they describe."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from metrale.bounds import (
    BYTES,
    COUNT,
    CPU_S,
    FILE_SIZE_MB,
    MAX_PROCS,
    MEMORY_MB,
    RATE_PER_S,
    TIMEOUT_S,
    TMPFS_MB,
)
from metrale.cli.parsing import bounded
from metrale.errors import UsageError

if TYPE_CHECKING:
    from metrale.runtime.base import RuntimeConfig

#: `--runtime none`: no sandbox, rollouts run in metrale's process (as in a sweep's axis)
NO_RUNTIME = "none"


def add_runtime_args(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    """Flags that choose and shape a runtime (where commands run); see `runtime_from_args`.
    In a sweep, `--runtime` is a comma list and the shaping flags apply to each runtime."""
    g = p.add_argument_group(
        "runtime",
        "where rollouts' commands run; in a sweep the options apply to every runtime of it"
        if sweep
        else "where rollouts' commands run",
    )
    names = "none (in metrale's process), subprocess, bwrap, docker, ray or prime"
    g.add_argument(
        "--runtime",
        metavar="LIST" if sweep else "NAME",
        help=f"a comma list of {names}, e.g. none,bwrap" if sweep else names,
    )
    g.add_argument(
        "--retries-runtime",
        type=bounded(COUNT),
        metavar="N",
        help="retries of a sandbox start that failed (default 0)",
    )
    g.add_argument(
        "--runtime-rate",
        type=bounded(RATE_PER_S),
        metavar="PER_S",
        help="at most this many sandbox starts per second",
    )
    g.add_argument(
        "--start-limit",
        type=bounded(COUNT),
        metavar="N",
        help="sandbox starts in flight at once (default: adaptive, from the cores and the "
        "measured start latency; 0 = no bound); the wait for a slot is recorded as setup_wait",
    )
    g.add_argument(
        "--runtime-pool",
        type=bounded(COUNT),
        metavar="N",
        help="keep N sandboxes started ahead of the rollouts that will use them, each used "
        "once (default 0); their start is reported as pool_start, apart from setup",
    )
    g.add_argument(
        "--image", help="docker: image (default metrale/base:bookworm); prime: a registry name"
    )
    g.add_argument(
        "--start-timeout",
        type=bounded(TIMEOUT_S),
        metavar="S",
        help="prime: seconds from a creation to a usable sandbox (default 300); past it the "
        "rollout fails with runtime_start and its sandbox is deleted",
    )
    g.add_argument("--docker-cli", metavar="CLI", help="docker: CLI to use (docker, podman)")
    g.add_argument("--ray-address", metavar="ADDR", help="ray: auto, HOST:PORT or local")
    g.add_argument(
        "--ray-inner", metavar="NAME", help="ray: sandbox per actor, subprocess or bwrap"
    )
    g.add_argument(
        "--cpu-seconds",
        type=bounded(CPU_S),
        metavar="S",
        help="CPU seconds per process (RLIMIT_CPU)",
    )
    g.add_argument(
        "--memory-mb",
        type=bounded(MEMORY_MB),
        metavar="MB",
        help="bwrap: the sandbox's total memory where a memory cgroup can be made, else per "
        "process (default 8192); subprocess: address space per process; docker: container memory",
    )
    g.add_argument(
        "--tmp-mb",
        type=bounded(TMPFS_MB),
        metavar="MB",
        help="bwrap: size of the sandbox's /tmp tmpfs (default 512)",
    )
    g.add_argument(
        "--env",
        action="append",
        metavar="NAME[=VALUE]",
        help="pass a variable into every sandbox (NAME alone: its value in metrale's "
        "environment); nothing else of metrale's environment reaches a sandbox (repeatable)",
    )
    g.add_argument(
        "--max-procs",
        type=bounded(MAX_PROCS),
        metavar="N",
        help="processes of the sandbox user (docker: pids limit)",
    )
    g.add_argument(
        "--file-size-mb",
        type=bounded(FILE_SIZE_MB),
        metavar="MB",
        help="largest file a process may write",
    )
    g.add_argument(
        "--bind",
        action="append",
        metavar="SRC[:DST]",
        help="bwrap: writable bind of a host path (repeatable)",
    )
    g.add_argument(
        "--ro-bind",
        action="append",
        metavar="SRC[:DST]",
        help="bwrap: read-only bind of a host path (repeatable)",
    )
    g.add_argument(
        "--network",
        action="store_true",
        help="let sandboxes reach the network (bwrap: host network; docker: bridge)",
    )
    g.add_argument(
        "--output-cap",
        type=bounded(BYTES),
        metavar="BYTES",
        help="stdout/stderr kept per command, head and tail (default 1 MiB)",
    )


def _env_args(items: list[str] | None) -> dict[str, str] | None:
    """`--env NAME` (value from metrale's environment) and `--env NAME=VALUE`, in order."""
    if not items:
        return None
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name or "\0" in item:
            raise UsageError(f"--env {item!r}: expected NAME or NAME=VALUE")
        if not sep:
            if name not in os.environ:
                raise UsageError(
                    f"--env {name}: {name} is not set in metrale's environment; "
                    f"set it or pass --env {name}=VALUE"
                )
            value = os.environ[name]
        env[name] = value
    return env


#: each runtime-shaping flag: its argparse dest and its `runtime_config` option
_FLAGS: dict[str, tuple[str, str]] = {
    "--image": ("image", "image"),
    "--start-timeout": ("start_timeout", "start_timeout"),
    "--docker-cli": ("docker_cli", "cli"),
    "--ray-address": ("ray_address", "address"),
    "--ray-inner": ("ray_inner", "inner"),
    "--cpu-seconds": ("cpu_seconds", "cpu_s"),
    "--memory-mb": ("memory_mb", "memory_mb"),
    "--max-procs": ("max_procs", "max_procs"),
    "--file-size-mb": ("file_size_mb", "file_size_mb"),
    "--bind": ("bind", "rw_binds"),
    "--ro-bind": ("ro_bind", "ro_binds"),
    "--output-cap": ("output_cap", "output_cap_bytes"),
    "--runtime-rate": ("runtime_rate", "start_rate"),
    "--start-limit": ("start_limit", "start_limit"),
    "--runtime-pool": ("runtime_pool", "pool"),
    "--tmp-mb": ("tmp_mb", "tmp_mb"),
    "--env": ("env", "env"),
    "--network": ("network", "network"),
}


def given_runtime_flags(args: argparse.Namespace) -> list[str]:
    """The runtime flags the user gave, `--runtime none` excepted (it asks for no runtime)."""
    given = [
        flag for flag, (dest, _) in _FLAGS.items() if getattr(args, dest, None) not in (None, False)
    ]
    if getattr(args, "retries_runtime", None) is not None:
        given.insert(0, "--retries-runtime")
    runtime = getattr(args, "runtime", None)
    if runtime is not None and runtime.strip().lower() != NO_RUNTIME:
        given.insert(0, "--runtime")
    return given


def runtime_options(args: argparse.Namespace, name: str) -> dict[str, object]:
    """The `runtime_config` options the shaping flags give for runtime `name`."""
    options: dict[str, object] = {}
    for dest, option in _FLAGS.values():
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        if option == "env":
            value = _env_args(value)
        elif option == "network":
            value = "bridge" if name == "docker" else True
        options[option] = value
    return options


def shaping_flags(args: argparse.Namespace) -> list[str]:
    return [flag for flag, (dest, _) in _FLAGS.items() if getattr(args, dest, None)]


def runtime_from_args(args: argparse.Namespace) -> RuntimeConfig | None:
    """The RuntimeConfig the runtime flags describe; None without `--runtime` or with
    `--runtime none` (rollouts in metrale's own process)."""
    from metrale.runtime import runtime_config

    name = getattr(args, "runtime", None)
    if not name or name.strip().lower() == NO_RUNTIME:
        given = shaping_flags(args)
        if given:
            what = "--runtime none takes" if name else "need --runtime NAME; without it, there is"
            raise UsageError(f"runtime option(s) {', '.join(given)} {what} no sandbox to shape")
        return None
    return runtime_config(name, **runtime_options(args, name))
