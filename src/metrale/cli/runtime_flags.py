"""The runtime flags (which runtime, its limits and binds) and the RuntimeConfig they describe."""

from __future__ import annotations

import argparse
import os

from metrale.cli.parsing import non_negative_int, positive_float, positive_int
from metrale.errors import UsageError


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    """Flags that choose and shape a runtime (where commands run); see `runtime_from_args`."""
    g = p.add_argument_group("runtime")
    g.add_argument("--runtime", metavar="NAME", help="subprocess, bwrap, docker or ray")
    g.add_argument(
        "--retries-runtime",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="retries of a sandbox start that failed (default 0)",
    )
    g.add_argument(
        "--runtime-rate",
        type=positive_float,
        metavar="PER_S",
        help="at most this many sandbox starts per second",
    )
    g.add_argument("--image", help="docker: image (default metrale/base:bookworm)")
    g.add_argument("--docker-cli", metavar="CLI", help="docker: CLI to use (docker, podman)")
    g.add_argument("--ray-address", metavar="ADDR", help="ray: auto, HOST:PORT or local")
    g.add_argument(
        "--ray-inner", metavar="NAME", help="ray: sandbox per actor, subprocess or bwrap"
    )
    g.add_argument(
        "--cpu-seconds",
        type=non_negative_int,
        metavar="S",
        help="CPU seconds per process (RLIMIT_CPU)",
    )
    g.add_argument(
        "--memory-mb",
        type=non_negative_int,
        metavar="MB",
        help="bwrap: the sandbox's total memory where a memory cgroup can be made, else per "
        "process (default 8192); subprocess: address space per process; docker: container memory",
    )
    g.add_argument(
        "--tmp-mb",
        type=positive_int,
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
        type=non_negative_int,
        metavar="N",
        help="processes of the sandbox user (docker: pids limit)",
    )
    g.add_argument(
        "--file-size-mb",
        type=non_negative_int,
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
        type=non_negative_int,
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


def runtime_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The RuntimeConfig the runtime flags describe, or None without `--runtime`."""
    from metrale.runtime import runtime_config

    name = getattr(args, "runtime", None)
    options = {
        "image": getattr(args, "image", None),
        "cli": getattr(args, "docker_cli", None),
        "address": getattr(args, "ray_address", None),
        "inner": getattr(args, "ray_inner", None),
        "cpu_s": getattr(args, "cpu_seconds", None),
        "memory_mb": getattr(args, "memory_mb", None),
        "max_procs": getattr(args, "max_procs", None),
        "file_size_mb": getattr(args, "file_size_mb", None),
        "rw_binds": getattr(args, "bind", None),
        "ro_binds": getattr(args, "ro_bind", None),
        "output_cap_bytes": getattr(args, "output_cap", None),
        "start_rate": getattr(args, "runtime_rate", None),
        "tmp_mb": getattr(args, "tmp_mb", None),
        "env": _env_args(getattr(args, "env", None)),
    }
    if getattr(args, "network", False):
        options["network"] = "bridge" if name == "docker" else True
    if not name:
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise UsageError(f"runtime option(s) {', '.join(given)} need --runtime NAME")
        return None
    return runtime_config(name, **options)
