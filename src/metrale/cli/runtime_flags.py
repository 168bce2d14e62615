"""The runtime flags (which runtime, its limits and binds) and the RuntimeConfig they describe."""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import types
import typing
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from metrale.bounds import (
    BYTES,
    COUNT,
    CPU_S,
    FILE_SIZE_MB,
    MAX_PROCS,
    MEMORY_MB,
    RATE_PER_S,
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
    from metrale.runtime.registry import runtime_names

    names = f"none (in metrale's process), {', '.join(runtime_names())}"
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
        "--image",
        help="the sandbox's image, for runtimes that run one (docker: default "
        "metrale/base:bookworm; remote runtimes: a registry name)",
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
        help="let sandboxes reach the network (bwrap: host network; docker: bridge; prime, "
        "modal: the service's outbound network)",
    )
    g.add_argument(
        "--output-cap",
        type=bounded(BYTES),
        metavar="BYTES",
        help="stdout/stderr kept per command, head and tail (default 1 MiB)",
    )
    for flag, (runtime, field, kind, text) in (own_flags() if _OWN_WANTED[0] else {}).items():
        g.add_argument(flag, dest=_dest(flag), type=_parser(runtime, field, kind),
                       metavar=_METAVARS[kind], help=f"{runtime}: {text}")  # fmt: skip


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


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; accepted: true, false")


_PARSERS: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": _parse_bool}
_METAVARS = {"str": "TEXT", "int": "N", "float": "X", "bool": "BOOL"}


#: the range of a number field that declares none: no absurd value reaches a config
_UNDECLARED = (0.0, 1e9)


def _parser(runtime: str, field: str, kind: str) -> Any:
    """The flag's argparse type: numbers finite and within the field's declared range (`ge`,
    `le`, ... of its pydantic metadata; [0..1e9] where it declares none), so a runtime from
    another package gets the same checks as metrale's own."""
    if kind not in ("int", "float"):
        return _PARSERS[kind]
    from metrale.runtime.registry import config_class

    info = config_class(runtime).model_fields[field]
    lo, hi = _UNDECLARED
    for bound in info.metadata:
        lo = float(getattr(bound, "ge", getattr(bound, "gt", lo)))
        hi = float(getattr(bound, "le", getattr(bound, "lt", hi)))

    def parse(text: str) -> float | int:
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind == 'int' else 'a number'}"
            ) from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"{text!r}: accepted: a number in [{_num(lo)}..{_num(hi)}]"
            )
        return value

    return parse


def _num(x: float) -> str:
    return str(int(x)) if x.is_integer() else f"{x:g}"


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _kind(annotation: Any) -> str | None:
    """The flag type of a config field: a scalar (or an optional one), else None (no flag)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    for kind, cls in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if annotation is cls:
            return kind
    if typing.get_origin(annotation) is typing.Literal:
        return "str"
    from metrale.runtime.base import RuntimeConfig

    if annotation is RuntimeConfig:  # a runtime holding another (ray's inner): by its name
        return "str"
    return None


#: whether the parser being built needs the runtimes' own flags (`only_own_flags_in`)
_OWN_WANTED = [True]


@contextlib.contextmanager
def own_flags_for(argv: Sequence[str]) -> Iterator[None]:
    """While parsing `argv`: build the runtimes' own flags only when it may use them (help, or
    a token that starts with `--<runtime>-` for an installed runtime). Making them loads every
    runtime's config module (~15 ms), which a run that gives none of them need not pay."""
    from metrale.runtime.registry import runtime_names

    prefixes = tuple(f"--{name}-".replace("_", "-") for name in runtime_names())
    _OWN_WANTED[0] = any(token in ("-h", "--help") or token.startswith(prefixes) for token in argv)
    try:
        yield
    finally:
        _OWN_WANTED[0] = True


@functools.cache
def own_flags() -> dict[str, tuple[str, str, str, str]]:
    """`--<runtime>-<field>` for each scalar field with a description of each installed
    runtime's config that no shared flag sets: flag -> (runtime, field, kind, help). Generated,
    so a runtime from another package gets its flags by declaring its fields."""
    from metrale.runtime.base import RuntimeConfig
    from metrale.runtime.registry import config_classes

    shared = {option for _, option in _FLAGS.values()} | set(RuntimeConfig.model_fields)
    flags: dict[str, tuple[str, str, str, str]] = {}
    for runtime, cls in config_classes().items():
        for field, info in cls.model_fields.items():
            kind = _kind(info.annotation)
            if field in shared or not info.description or kind is None:
                continue
            flag = f"--{runtime}-{field}".replace("_", "-")
            flags[flag] = (runtime, field, kind, info.description)
    return flags


#: each shared runtime-shaping flag: its argparse dest and its `runtime_config` option
_FLAGS: dict[str, tuple[str, str]] = {
    "--image": ("image", "image"),
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
    given = shaping_flags(args)
    if getattr(args, "retries_runtime", None) is not None:
        given.insert(0, "--retries-runtime")
    runtime = getattr(args, "runtime", None)
    if runtime is not None and runtime.strip().lower() != NO_RUNTIME:
        given.insert(0, "--runtime")
    return given


def _parsed_own_flags(args: argparse.Namespace) -> dict[str, tuple[str, str, str, str]]:
    """`own_flags()` when the parse that made `args` had them (a dest `<runtime>_...`), else
    nothing: read after the parse, they would load every runtime's config module for a run
    that gave none of them (~25 modules, ~20 ms of start-up)."""
    from metrale.runtime.registry import runtime_names

    prefixes = tuple(f"{name}_" for name in runtime_names())
    return own_flags() if any(key.startswith(prefixes) for key in vars(args)) else {}


def runtime_options(args: argparse.Namespace, name: str) -> dict[str, object]:
    """The `runtime_config` options the shaping flags give for runtime `name` (its own
    `--<name>-<field>` flags, and those of the runtime it holds, as ray's `--ray-inner`)."""
    options: dict[str, object] = {}
    inner = getattr(args, "ray_inner", None) if name == "ray" else None
    for flag, (runtime, field, _, _) in _parsed_own_flags(args).items():
        value = getattr(args, _dest(flag), None)
        if value is None:
            continue
        if runtime not in (name, inner):
            raise UsageError(
                f"{flag} shapes the {runtime} runtime, and this run's is {name}; accepted: "
                f"--runtime {runtime}"
            )
        options[field] = value
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
    """Every runtime-shaping flag given (the shared ones, then each runtime's own)."""
    given = [flag for flag, (dest, _) in _FLAGS.items() if getattr(args, dest, None)]
    given += [f for f in _parsed_own_flags(args) if getattr(args, _dest(f), None) is not None]
    return given


def runtime_from_args(args: argparse.Namespace) -> RuntimeConfig | None:
    """The RuntimeConfig the runtime flags describe; None without `--runtime` or with
    `--runtime none` (rollouts in metrale's own process)."""
    name = getattr(args, "runtime", None)
    if not name or name.strip().lower() == NO_RUNTIME:
        given = shaping_flags(args)
        if given:
            what = "--runtime none takes" if name else "need --runtime NAME; without it, there is"
            raise UsageError(f"runtime option(s) {', '.join(given)} {what} no sandbox to shape")
        return None
    from metrale.runtime import runtime_config  # a run without a runtime loads none of it

    return runtime_config(name, **runtime_options(args, name))
