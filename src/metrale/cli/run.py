"""`metrale run`: one benchmark against a target, one run directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrale.cli.aio import run_async
from metrale.cli.bench_flags import (
    add_bench_args,
    bench_group,
    given_values,
    one_value_each,
    refuse_extra,
)
from metrale.cli.options import refuse_model_flags, refuse_no_runtime, refuse_unused
from metrale.cli.parsing import out_dir
from metrale.cli.runtime_flags import add_runtime_args, runtime_from_args
from metrale.cli.target import (
    add_target_args,
    calls_in_flight,
    client_options,
    open_target,
    resolve_api_key,
)
from metrale.errors import UsageError
from metrale.fmt import safe_json, safe_text

if TYPE_CHECKING:
    from metrale.plugin import Benchmark


def add_parser(sub: Any, bench: type[Benchmark] | None = None) -> None:
    bench_id = bench.descriptor.id if bench is not None else None
    p = sub.add_parser(
        "run",
        # Benchmark parameters may also arrive as unknown flags: no abbreviation may swallow
        # one (serve's --api would otherwise be taken for --api-key).
        allow_abbrev=False,
        prog=f"metrale run {bench_id}" if bench_id else None,
        help="run one benchmark against a target",
        description=(
            f"Run {bench_id}: {bench.descriptor.summary}"
            if bench is not None
            else "Run a benchmark. Its parameters are flags too: 'metrale run BENCH --help' "
            "lists them (see 'metrale list' for the benchmarks)."
        ),
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
    group = bench_group(p, bench, sweep=False)
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
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress")
    p.value_hints = add_bench_args(p, group, bench, sweep=False)
    p.set_defaults(handler=handle, bench_cls=bench)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale import runner
    from metrale.budgets import load_budgets
    from metrale.plugin import get_benchmark
    from metrale.table import render

    if args.retry_errors and args.resume is None:
        raise UsageError("--retry-errors needs --resume RUN_DIR")
    if args.resume is None and not args.benchmark:
        raise UsageError("metrale run needs a benchmark id (see 'metrale list') or --resume")
    bench_cls = args.bench_cls
    if bench_cls is None and args.benchmark:
        bench_cls = get_benchmark(args.benchmark)  # an unknown id: the list of known ones
    specs = bench_cls().parameters() if bench_cls is not None else []
    refuse_extra(extra, specs, f"metrale run {args.benchmark or ''}".strip())
    raw: dict[str, object] = dict(one_value_each(given_values(args, args.param, specs), specs))
    if args.resume is None:  # a resumed run's flags are judged against its run.json instead
        fresh = get_benchmark(args.benchmark)()
        fresh.configure(raw)  # bad parameters first: a flag is judged against valid ones
        refuse_unused(fresh, args)
        refuse_no_runtime(fresh, args)
    runtime = runtime_from_args(args)
    options = client_options(args)
    if args.resume is not None:
        from metrale.endpoint.client import ClientOptions
        from metrale.resume import resumed_run

        if args.overwrite:
            raise UsageError("--overwrite conflicts with --resume")
        earlier = resumed_run(
            args.resume,
            args,
            raw,
            runtime,
            options,
            ClientOptions(),
            api_key=resolve_api_key(args.api_key),
        )
        for line in earlier.describe(args.resume):
            print(safe_text(line), file=sys.stderr)
        args.benchmark, args.target, args.model = earlier.benchmark, earlier.target, earlier.model
        raw, runtime, options, budgets = (
            earlier.params,
            earlier.runtime,
            earlier.client,
            earlier.budgets,
        )
    else:
        budgets_path = args.budgets
        if budgets_path is None and Path("BENCH.toml").is_file():
            budgets_path = Path("BENCH.toml")
        budgets = load_budgets(budgets_path, args.benchmark) if budgets_path else {}
    bench = get_benchmark(args.benchmark)()
    bench.configure(raw)
    needs_model = bench.needs_model()
    if not needs_model:
        refuse_model_flags(bench, args)
    if runtime is not None:
        from metrale.runtime import check_runtime

        check_runtime(runtime)

    async def go() -> runner.RunResult:
        request = runner.RunRequest(
            benchmark=args.benchmark,
            params=raw,
            target=None,
            client_options=options,
            out=args.resume if args.resume is not None else args.out,
            resume=args.resume is not None,
            retry_errors=args.retry_errors,
            overwrite=args.overwrite,
            budgets=budgets,
            preflight=not args.no_preflight,
            progress=None if args.quiet else sys.stderr,
            runtime=runtime,
            runtime_retries=args.retries_runtime or 0,
        )
        runner.prepare(request)  # bad parameters fail before a server starts
        runner.check_run_dir(request)  # so does a run directory that must not be written
        async with open_target(
            args.target,
            args.model,
            args.api_key,
            needs_model=needs_model,
            in_flight=calls_in_flight(bench),
        ) as target:
            request.target = target
            return await runner.run(request)

    outcome = run_async(go)
    result = outcome.result
    out = sys.stderr if args.json else sys.stdout
    if result.table.columns:
        print(render(result.table.columns, result.table.rows), file=out)
    if result.measured is not None and len(result.measured.per_task) > 1:
        from metrale.plugin.per_task import per_task_table

        k = int(result.measured.metrics.get("attempts") or 1)
        print(render(*per_task_table(result.measured.per_task, k)), file=out)
    for line in result.verdict.lines():
        print(safe_text(line), file=out)
    if result.error:
        print(f"run failed: {safe_text(result.error, lines=False)}", file=sys.stderr)
    print(f"run directory: {safe_text(outcome.run_dir, lines=False)}", file=sys.stderr)
    if args.json:
        print(safe_json(outcome.model_dump_json(indent=2)))
    return outcome.exit_code
