"""Benchmark parameters as flags, generated from the benchmark's `ParamSpec`s.

`metrale run gsm8k --help` shows gsm8k's parameters with their types, bounds and defaults
because the flags are made from the declarations: `--max-tokens 64` and `-p max_tokens=64` are
the same. The values stay strings here; `ParamSpec.coerce` (in `configure`) checks them, so a
bad value says the same thing from a flag, `-p`, a sweep file or a run.json. For `matrix`, a
declared sweep axis takes a comma list and sweeps it; any other parameter takes one value.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from metrale.errors import UsageError
from metrale.plugin import Benchmark, ParamSpec

#: argparse dest of a parameter's flag: apart from the run-wide flags' dests
DEST_PREFIX = "param__"
_METAVAR = {"int": "N", "float": "X", "str": "TEXT", "bool": "BOOL"}


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def bench_group(
    parser: argparse.ArgumentParser, bench_cls: type[Benchmark] | None, *, sweep: bool
) -> argparse._ArgumentGroup | None:
    """The help section of the benchmark's parameters, made early so that `--help` shows it
    first; `add_bench_args` fills it once the run-wide flags exist."""
    if bench_cls is None:
        return None
    what = "a comma list sweeps a parameter marked 'sweep axis'" if sweep else "one value each"
    return parser.add_argument_group(
        f"{bench_cls.descriptor.id} parameters",
        f"{what}; -p NAME=VALUE sets any of them too (see 'metrale list').",
    )


def add_bench_args(
    parser: argparse.ArgumentParser,
    group: argparse._ArgumentGroup | None,
    bench_cls: type[Benchmark] | None,
    *,
    sweep: bool,
) -> dict[str, str]:
    """Add one flag per parameter of `bench_cls` (a bool also as `--no-NAME`) to `group`.
    Returns each flag's accepted values, for the message of a flag given without one. A
    parameter whose flag a run-wide flag already owns is reachable with `-p` only."""
    if bench_cls is None or group is None:
        return {}
    bench = bench_cls()
    axes = set(bench.sweep_axes()) if sweep else set()
    hints: dict[str, str] = {}
    for spec in bench.parameters():
        flag = flag_of(spec.name)
        if flag in parser._option_string_actions:
            continue
        axis = spec.name in axes
        metavar = _METAVAR[spec.type] + ("[,...]" if axis else "")
        kwargs: dict[str, Any] = {
            "dest": DEST_PREFIX + spec.name,
            "action": "append",
            "metavar": metavar,
            "help": _help(spec, axis=axis),
        }
        if spec.type == "bool":
            kwargs["nargs"] = "?"
            kwargs["const"] = "true"
        group.add_argument(flag, **kwargs)
        if spec.type == "bool" and f"--no-{flag[2:]}" not in parser._option_string_actions:
            group.add_argument(
                f"--no-{flag[2:]}",
                dest=DEST_PREFIX + spec.name,
                action="append_const",
                const="false",
                help=argparse.SUPPRESS,
            )
        hints[flag] = spec.describe_type() + (" (a comma list sweeps it)" if axis else "")
    return hints


def _help(spec: ParamSpec, *, axis: bool) -> str:
    default = "none" if spec.default is None else repr(spec.default)
    if len(default) > 40:
        default = default[:36] + "..."
    text = f"{spec.help} [{spec.describe_type()}; default {default}"
    if spec.type == "bool":
        text += f"; --no-{spec.name.replace('_', '-')} for false"
    text += "; sweep axis]" if axis else "]"
    return text.replace("%", "%%")


def given_values(
    args: argparse.Namespace, pairs: Sequence[str], specs: Sequence[ParamSpec]
) -> dict[str, list[str]]:
    """Each parameter's raw values in the order given, from its flag and from `-p KEY=VALUE`.
    A `-p` name that is not a parameter is kept, for `configure` to refuse with the list."""
    values: dict[str, list[str]] = {}
    for spec in specs:
        found = getattr(args, DEST_PREFIX + spec.name, None)
        if found:
            values[spec.name] = list(found)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"-p expects KEY=VALUE, got {pair!r}")
        values.setdefault(key, []).append(value)
    return values


def one_value_each(values: dict[str, list[str]], specs: Sequence[ParamSpec]) -> dict[str, str]:
    """For `run`: a repeated str parameter accumulates, comma-joined (`--slo ttft_ms=200
    --slo tpot_ms=50`); any other parameter given twice is an error naming it."""
    by_name = {s.name: s for s in specs}
    out: dict[str, str] = {}
    for name, items in values.items():
        spec = by_name.get(name)
        if len(items) > 1 and (spec is None or spec.type != "str"):
            raise UsageError(
                f"{flag_of(name)} is given {len(items)} times ({', '.join(items)}); give it once"
            )
        out[name] = ",".join(items)
    return out


def refuse_extra(extra: Sequence[str], specs: Sequence[ParamSpec], prog: str) -> None:
    """What argparse left over: an unknown `--name` is an unknown parameter of the benchmark."""
    if not extra:
        return
    token = extra[0]
    if token.startswith("--") and len(token) > 2:
        name = token[2:].partition("=")[0].replace("-", "_")
        valid = ", ".join(sorted(s.name for s in specs)) or "(none)"
        raise UsageError(
            f"unknown parameter {name!r}; valid parameters: {valid} (see '{prog} --help')"
        )
    raise UsageError(f"unexpected argument {token!r}; benchmark parameters are --name VALUE")
