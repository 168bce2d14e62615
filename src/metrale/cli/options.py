"""Every run-wide flag is honoured or refused: the check, before any work.

A benchmark lists the run-wide flags it honours (`Benchmark.options`, from `plugin.RUN_OPTIONS`).
A flag the user gave that the chosen benchmark does not honour is a usage error naming the flag
and the benchmark, never a flag silently ignored while run.json records it as used. A
configuration that calls no model (`needs_model()` False) refuses the target and client flags.
`run` and `matrix` share this check, so that both accept the same flags the same way.
"""

from __future__ import annotations

import argparse

from metrale.cli.runtime_flags import given_runtime_flags
from metrale.errors import UsageError
from metrale.plugin import RUN_OPTIONS, Benchmark

#: the flags of each run-wide option other than `runtime` (the runtime group's flags)
_CLIENT_FLAGS: dict[str, tuple[str, str]] = {
    "retries": ("retries", "--retries"),
    "request_timeout": ("request_timeout", "--request-timeout"),
    "stream": ("no_stream", "--no-stream"),
    "max_response": ("max_response_kb", "--max-response-kb"),
}
#: flags that name or reach the model: meaningless for a configuration that calls none
_MODEL_FLAGS: dict[str, str] = {"target": "--target", "model": "--model", "api_key": "--api-key"}


def given_flags(args: argparse.Namespace) -> dict[str, list[str]]:
    """The run-wide flags given, by the `RUN_OPTIONS` entry they belong to."""
    given: dict[str, list[str]] = {"runtime": given_runtime_flags(args)}
    for option, (dest, flag) in _CLIENT_FLAGS.items():
        value = getattr(args, dest, None)
        given[option] = [flag] if value not in (None, False) else []
    return given


def _flags_text(option: str) -> str:
    return "--runtime and its options" if option == "runtime" else _CLIENT_FLAGS[option][1]


def refuse_unused(bench: Benchmark, args: argparse.Namespace) -> None:
    """UsageError for the first given flag `bench` does not honour (see the module docstring)."""
    bench_id = type(bench).descriptor.id
    given = given_flags(args)
    honoured = [o for o in RUN_OPTIONS if o in bench.options]
    for option in RUN_OPTIONS:
        flags = given.get(option) or []
        if not flags or option in bench.options:
            continue
        if option == "runtime":
            raise UsageError(
                f"{flags[0]} does not apply to {bench_id}: it runs nothing in a sandbox "
                "(accepted: --runtime none or no --runtime)"
            )
        takes = ", ".join(_flags_text(o) for o in honoured) or "none of them"
        raise UsageError(
            f"{flags[0]} does not apply to {bench_id}; the run-wide flags it honours: {takes}"
        )


def refuse_model_flags(bench: Benchmark, args: argparse.Namespace) -> None:
    """For a configuration that calls no model: the target and client flags are refused."""
    given = given_flags(args)
    bench_id = type(bench).descriptor.id
    model_flags = [f for d, f in _MODEL_FLAGS.items() if getattr(args, d, None)]
    model_flags += [f for o, fs in given.items() if o != "runtime" for f in fs]
    if getattr(args, "tier", None):
        model_flags.append("--tier")
    if model_flags:
        raise UsageError(
            f"{model_flags[0]} does not apply: {bench_id} as configured calls no model"
        )


def refuse_no_runtime(bench: Benchmark, args: argparse.Namespace) -> None:
    """`--runtime none` for a benchmark that needs a sandbox: refused as `matrix` refuses it."""
    runtime = getattr(args, "runtime", None)
    if runtime is None or runtime.strip().lower() != "none" or "runtime" not in bench.options:
        return
    default = bench.runtime_choice(None)
    if default is not None:
        raise UsageError(
            f"{type(bench).descriptor.id} needs a runtime, so --runtime none does not apply; "
            f"its default is {default.type}"
        )
