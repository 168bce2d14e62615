"""`metrale run`: one benchmark against a target, one run directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.cli.aio import run_async
from metrale.cli.bench_flags import parse_bench_args
from metrale.cli.parsing import out_dir
from metrale.cli.runtime_flags import add_runtime_args, runtime_from_args
from metrale.cli.target import add_target_args, client_options, open_target
from metrale.errors import UsageError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        # Benchmark parameters arrive as unknown flags: no abbreviation may swallow one
        # (serve's --api would otherwise be taken for --api-key).
        allow_abbrev=False,
        help="run one benchmark against a target",
        description="Run a benchmark. Benchmark parameters are flags too: "
        "--rollouts 8, or -p rollouts=8 (see 'metrale list').",
    )
    p.add_argument(
        "benchmark", nargs="?", help="benchmark id (see 'metrale list'); none with --resume"
    )
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a benchmark parameter (repeatable)",
    )
    add_target_args(p)
    add_runtime_args(p)
    p.add_argument(
        "--out",
        type=out_dir,
        metavar="DIR",
        help="run directory (default runs/<UTC timestamp>-<benchmark>); one that holds an "
        "earlier run is refused unless --overwrite",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the earlier run held in --out")
    p.add_argument(
        "--resume",
        type=out_dir,
        metavar="RUN_DIR",
        help="finish an earlier run: run only its missing rollouts, with its run.json settings",
    )
    p.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --resume: run the failed rollouts again too (their old records move to "
        "retried.jsonl)",
    )
    p.add_argument(
        "--budgets",
        type=Path,
        metavar="FILE",
        help="budgets file (default ./BENCH.toml when it exists)",
    )
    p.add_argument("--json", action="store_true", help="print the final result as JSON")
    p.add_argument("--no-preflight", action="store_true", help="skip the 2+2 sanity check")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale import runner
    from metrale.budgets import load_budgets
    from metrale.table import render

    if args.resume is not None and args.benchmark is not None:
        extra = _reclaim_positional(args, extra)
    raw: dict[str, object] = dict(parse_bench_args(extra, args.param))
    runtime = runtime_from_args(args)
    options = client_options(args)
    if args.retry_errors and args.resume is None:
        raise UsageError("--retry-errors needs --resume RUN_DIR")
    if args.resume is not None:
        from metrale.resume import resumed_run

        if args.overwrite:
            raise UsageError("--overwrite conflicts with --resume")
        from metrale.cli import build_parser

        defaults = client_options(build_parser().parse_known_args(["run", "x"])[0])
        earlier = resumed_run(args.resume, args, raw, runtime, options, defaults)  # type: ignore[arg-type]
        args.benchmark, args.target, args.model = earlier.benchmark, earlier.target, earlier.model
        raw, runtime, options, budgets = (
            earlier.params,
            earlier.runtime,
            earlier.client,
            earlier.budgets,
        )
    else:
        if not args.benchmark:
            raise UsageError("metrale run needs a benchmark id (see 'metrale list') or --resume")
        budgets_path = args.budgets
        if budgets_path is None and Path("BENCH.toml").is_file():
            budgets_path = Path("BENCH.toml")
        budgets = load_budgets(budgets_path, args.benchmark) if budgets_path else {}
    if runtime is not None:
        from metrale.runtime import check_runtime

        check_runtime(runtime)

    async def go() -> runner.RunResult:
        from metrale.endpoint.client import Target

        request = runner.RunRequest(
            benchmark=args.benchmark,
            params=raw,
            target=Target(base_url="", model=""),
            client_options=options,
            out=args.resume if args.resume is not None else args.out,
            resume=args.resume is not None,
            retry_errors=args.retry_errors,
            overwrite=args.overwrite,
            budgets=budgets,
            preflight=not args.no_preflight,
            runtime=runtime,
            runtime_retries=args.retries_runtime,
        )
        runner.prepare(request)  # bad parameters fail before a server starts
        runner.check_run_dir(request)  # so does a run directory that must not be written
        async with open_target(args) as target:
            request.target = target
            return await runner.run(request)

    outcome = run_async(go)
    result = outcome.result
    out = sys.stderr if args.json else sys.stdout
    if result.table.columns:
        print(render(result.table.columns, result.table.rows), file=out)
    for line in result.verdict.lines():
        print(line, file=out)
    if result.error:
        print(f"run failed: {result.error}", file=sys.stderr)
    print(f"run directory: {outcome.run_dir}", file=sys.stderr)
    if args.json:
        print(outcome.model_dump_json(indent=2))
    return outcome.exit_code


def _reclaim_positional(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """`run --resume DIR --rollouts 9`: argparse takes `9` for the (optional) benchmark id.
    A value that names no benchmark goes back after the first parameter flag left without
    one."""
    from metrale.plugin import discover

    tokens = list(extra)
    if args.benchmark in discover():
        return tokens
    for i, tok in enumerate(tokens):
        bare = tok.startswith("--") and "=" not in tok
        if bare and (i + 1 == len(tokens) or tokens[i + 1].startswith("--")):
            tokens.insert(i + 1, args.benchmark)
            args.benchmark = None
            break
    return tokens
