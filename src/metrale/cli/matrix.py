"""`metrale matrix`: a sweep of cells, each a run, one file per cell."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.cli.aio import run_async
from metrale.cli.parsing import no_extra, non_negative_int, out_dir
from metrale.cli.target import add_target_args, client_options, open_target


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "matrix",
        help="sweep a benchmark over runtimes, rollout counts, caps and tiers",
        description="Run one cell per point of the sweep, each through the runner, and write "
        "<out>/<cell>.json per cell. Lists are comma-separated; a flag overrides the file.",
    )
    p.add_argument("benchmark", nargs="?", help="benchmark id (or benchmark = in --config)")
    p.add_argument("--config", type=Path, metavar="FILE", help="sweep file (TOML)")
    p.add_argument("--runtime", metavar="LIST", help="runtimes, e.g. none,subprocess,bwrap")
    p.add_argument("--rollouts", metavar="LIST", help="rollout counts, e.g. 64,512")
    p.add_argument("--max-concurrent", metavar="LIST", help="caps, none = unbounded, e.g. none,128")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=V1[,V2]",
        help="a benchmark parameter; a comma list sweeps it (repeatable)",
    )
    p.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="NAME=URL[,model=M]",
        help="a named deployment to sweep side by side (repeatable)",
    )
    add_target_args(p)
    p.add_argument("--out", type=out_dir, metavar="DIR", help="default results/<benchmark>")
    p.add_argument(
        "--resume", action="store_true", help="skip cells whose file says they completed"
    )
    p.add_argument("--only", metavar="GLOBS", help="run only cells whose name matches")
    p.add_argument("--no-preflight", action="store_true", help="skip the 2+2 sanity check")
    p.add_argument(
        "--retries-runtime",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="retries of a sandbox start that failed (default 0)",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.errors import EXIT_RUN_FAILED
    from metrale.matrix import plan_sweep, run_sweep
    from metrale.matrix.sweep import build_sweep, select, split_list

    no_extra(extra)
    sweep = build_sweep(
        benchmark=args.benchmark, config=args.config, runtime=args.runtime,
        rollouts=args.rollouts, max_concurrent=args.max_concurrent, params=args.param,
        tiers=args.tier, target=args.target, model=args.model, out=args.out,
    )  # fmt: skip
    plan = plan_sweep(sweep)
    cells = select(plan.cells, split_list(args.only) if args.only else [])

    async def go() -> list[Any]:
        async with contextlib.AsyncExitStack() as stack:
            targets = {}
            for tier in dict.fromkeys(c.tier for c in cells):
                tier_args = argparse.Namespace(
                    **{**vars(args), "target": tier.target, "model": tier.model}
                )
                targets[tier.name] = await stack.enter_async_context(open_target(tier_args))
            return await run_sweep(
                plan,
                targets,
                client_options=client_options(args),
                preflight=not args.no_preflight,
                cells=cells,
                runtime_retries=args.retries_runtime,
                resume=args.resume,
            )

    results = run_async(go)
    failed = sum(1 for r in results if r.status == "failed")
    print(f"{len(results)} cells ({failed} failed) in {sweep.out}", file=sys.stderr)
    return EXIT_RUN_FAILED if failed else 0
