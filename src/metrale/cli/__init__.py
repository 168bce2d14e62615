"""The `metrale` command: flags, exit codes, and choosing the target. No measuring here.

One module per command (`run`, `listing`, `sim`, `sandbox_sim`, `matrix`, `report`, `plot`,
`compare`, `sandbox_exec`, `cleanup`, `tasks`), each with `add_parser(sub)` and `handle(args,
extra)`; the flags they share live in `parsing`, `target`, `runtime_flags`, `bench_flags` and
`options`.

Exit codes: 0 done (verdict passed or none), 1 verdict failed, 2 usage error, 3 run failed.
A user's mistake is one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from metrale import __version__
from metrale.cli import (
    cleanup,
    compare,
    listing,
    matrix,
    plot,
    report,
    run,
    sandbox_exec,
    sandbox_sim,
    sim,
    tasks,
)
from metrale.cli.logs import configure as configure_logging
from metrale.cli.parsing import Parser
from metrale.cli.runtime_flags import own_flags_for
from metrale.errors import EXIT_USAGE, MetraleError
from metrale.fmt import safe_text

if TYPE_CHECKING:
    from metrale.plugin import Benchmark

#: `metrale list` is `listing` and `metrale exec` is `sandbox_exec`: modules named `list` and
#: `exec` would shadow the builtins in this package's namespace
COMMANDS = (
    run,
    listing,
    sim,
    sandbox_sim,
    matrix,
    report,
    plot,
    compare,
    sandbox_exec,
    cleanup,
    tasks,
)


DESCRIPTION = """\
metrale measures LLM endpoints and the rollouts that run against them. Point it at an
OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama, a hosted API) with --target, or let
it start a small embedded model, pick a benchmark, and get per-rollout records, a table of
stage timings (p50 with p10-p90), reward and errors, a verdict against budgets, and plots.
Sweep the same work over runtimes (subprocess, bwrap, docker, ray), rollout counts and
concurrency, one results file per cell."""

EPILOG = """\
benchmarks: {benchmarks}; 'metrale list' shows each with its parameters,
'metrale run BENCH --help' one benchmark's parameters.

examples:
  metrale sim --port 8000 &                      # a deterministic endpoint to try things on
  metrale run gsm8k --target http://127.0.0.1:8000/v1 --rollouts 64 --max-concurrent 8
  metrale matrix gsm8k --runtime none,bwrap --rollouts 64,256 --max-concurrent none,16
  metrale report results/gsm8k && metrale plot results/gsm8k -o gsm8k.png
  metrale compare results/before results/after

exit codes: 0 done, 1 verdict failed, 2 usage error, 3 run failed."""


def epilog() -> str:
    """The help's epilog, naming every installed benchmark from its entry point (no import:
    a written list went stale when terminal_bench was added)."""
    from metrale.plugin import benchmark_ids

    return EPILOG.format(benchmarks=", ".join(benchmark_ids()) or "(none installed)")


#: the commands whose flags include a benchmark's parameters (`bench_flags`)
BENCH_COMMANDS = ("run", "matrix")

VERBOSE_HELP = "diagnostics on stderr (why a cleanup failed, ...): -v info, -vv debug"


def build_parser(bench: type[Benchmark] | None = None) -> Parser:
    """The whole command line; with `bench`, `run` and `matrix` also take its parameters."""
    parser = Parser(
        prog="metrale",
        description=DESCRIPTION,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"metrale {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        if command.__name__.rsplit(".", 1)[-1] in BENCH_COMMANDS:
            command.add_parser(sub, bench)
        else:
            command.add_parser(sub)
    for each in sub.choices.values():  # `run gsm8k -v` too (a count there wins)
        each.add_argument(
            "-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP
        )
    return parser


def peek_benchmark(argv: Sequence[str]) -> type[Benchmark] | None:
    """The benchmark a `run` or `matrix` command line names, found before the real parse so
    that the parse (and `--help`) knows its parameter flags: the positional id, else the run
    directory of `--resume`, else the sweep file of `--config`. None when there is none; the
    real parse then reports what is wrong."""
    from metrale.plugin import benchmark_ids, canonical_id, get_benchmark

    tokens = [t for t in argv if t not in ("-h", "--help", "--version")]
    while tokens and re.fullmatch(r"-v+|--verbose", tokens[0]):  # the top-level -v, -vv
        tokens.pop(0)
    if not tokens or tokens[0] not in BENCH_COMMANDS:
        return None
    try:
        args, _ = build_parser().parse_known_args(tokens)
    except (MetraleError, SystemExit):
        return None
    installed = benchmark_ids()  # names only: importing every benchmark would slow each run
    name = getattr(args, "benchmark", None)
    if name is None or canonical_id(name) not in installed:
        name = None
        if args.command == "run" and args.resume is not None:
            from metrale.rundir import run_benchmark_id

            name = run_benchmark_id(args.resume)
        elif args.command == "matrix" and args.config is not None:
            name = _sweep_file_benchmark(args.config)
    if not name or canonical_id(name) not in installed:
        return None
    return get_benchmark(name)


def _sweep_file_benchmark(path: Path) -> str | None:
    from metrale.matrix.sweep import load_toml

    try:
        name = load_toml(path).get("benchmark")
    except MetraleError:
        return None
    return name if isinstance(name, str) else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with own_flags_for(argv):
            parser = build_parser(peek_benchmark(argv))
            args, extra = parser.parse_known_args(argv)
        configure_logging(args.verbose)
        if getattr(args, "handler", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.handler(args, extra))
    except MetraleError as exc:
        print(f"metrale: error: {safe_text(exc, lines=False)}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("metrale: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `metrale report DIR | head`: the reader left; say nothing more, as `cat` would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
