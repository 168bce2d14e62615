"""`metrale matrix`: a sweep of cells, each a run, one file per cell."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrale.cli.aio import run_async
from metrale.cli.bench_flags import add_bench_args, bench_group, given_values, refuse_extra
from metrale.cli.options import refuse_model_flags, refuse_unused
from metrale.cli.parsing import no_extra, out_dir
from metrale.cli.runtime_flags import NO_RUNTIME, add_runtime_args, runtime_options, shaping_flags
from metrale.cli.target import add_target_args, calls_in_flight, client_options, open_target
from metrale.errors import UsageError
from metrale.fmt import safe_text
from metrale.plugin.params import STANDARD_AXES

if TYPE_CHECKING:
    from metrale.endpoint.client import Target
    from metrale.matrix.sweep import Sweep, Tier
    from metrale.plugin import Benchmark, ParamSpec


def add_parser(sub: Any, bench: type[Benchmark] | None = None) -> None:
    bench_id = bench.descriptor.id if bench is not None else None
    p = sub.add_parser(
        "matrix",
        allow_abbrev=False,
        prog=f"metrale matrix {bench_id}" if bench_id else None,
        help="sweep a benchmark over runtimes, rollout counts, caps and tiers",
        description="Run one cell per point of the sweep, each through the runner, and write "
        "<out>/<cell>.json per cell. A sweep axis takes a comma list; a flag overrides the "
        "file. The flags are run's: the target, client and runtime flags and the benchmark's "
        "parameters"
        + (f" ({bench_id}'s are below)." if bench_id else " ('metrale matrix BENCH --help')."),
    )
    p.add_argument("benchmark", nargs="?", help="benchmark id (or benchmark = in --config)")
    p.add_argument("--config", type=Path, metavar="FILE", help="sweep file (TOML)")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=V1[,V2]",
        help="a benchmark parameter; a comma list sweeps a sweep axis (repeatable)",
    )
    group = bench_group(p, bench, sweep=True)
    p.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="NAME=URL[,model=M]",
        help="a named deployment to sweep side by side (repeatable)",
    )
    add_target_args(p)
    add_runtime_args(p, sweep=True)
    p.add_argument("--out", type=out_dir, metavar="DIR", help="default results/<benchmark>")
    p.add_argument(
        "--resume", action="store_true", help="skip cells whose file says they completed"
    )
    p.add_argument("--only", metavar="GLOBS", help="run only cells whose name matches")
    p.add_argument("--no-preflight", action="store_true", help="skip the 2+2 sanity check")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress of each cell")
    p.value_hints = add_bench_args(p, group, bench, sweep=True)
    p.set_defaults(handler=handle, bench_cls=bench)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.errors import EXIT_RUN_FAILED
    from metrale.matrix import plan_sweep, run_sweep
    from metrale.matrix.execute import cell_params, runtime_judge
    from metrale.matrix.sweep import build_sweep, select, split_list
    from metrale.plugin import get_benchmark

    bench_cls = args.bench_cls
    name = args.benchmark
    if bench_cls is None and name:
        bench_cls = get_benchmark(name)  # an unknown id: the list of known ones
    specs = bench_cls().parameters() if bench_cls is not None else []
    if bench_cls is not None:
        refuse_extra(extra, specs, f"metrale matrix {bench_cls.descriptor.id}")
    else:
        no_extra(extra)
    values = sweep_values(args, bench_cls)
    standard = {k: ",".join(map(str, values.pop(k))) for k in STANDARD_AXES if k in values}
    sweep = build_sweep(
        benchmark=args.benchmark, config=args.config, runtime=args.runtime,
        rollouts=standard.get("rollouts"), max_concurrent=standard.get("max_concurrent"),
        params=[], param_values=values, tiers=args.tier, target=args.target, model=args.model,
        out=args.out,
    )  # fmt: skip
    # serve takes --runtime only as configured (live sessions): judged on the cells' instance
    bench = runtime_judge(sweep, get_benchmark(sweep.benchmark)())
    refuse_unused(bench, args)  # the target flags: judged below, per cell
    _apply_runtime_flags(sweep, bench, args)
    plan = plan_sweep(sweep)
    cells = select(plan.cells, split_list(args.only) if args.only else [])
    needs: dict[Tier, bool] = {}
    in_flight: dict[Tier, list[int | None]] = {}
    for cell in cells:
        probe = get_benchmark(sweep.benchmark)()
        probe.configure(cell_params(cell))
        needs[cell.tier] = needs.get(cell.tier, False) or probe.needs_model()
        in_flight.setdefault(cell.tier, []).append(calls_in_flight(probe))
    if not any(needs.values()):
        refuse_model_flags(bench, args)

    async def go() -> list[Any]:
        async with contextlib.AsyncExitStack() as stack:
            targets: dict[str, Target | None] = {}
            for tier, needed in needs.items():
                targets[tier.name] = await stack.enter_async_context(
                    open_target(
                        tier.target,
                        tier.model,
                        args.api_key,
                        needs_model=needed,
                        in_flight=widest(in_flight[tier]),
                    )
                )
            return await run_sweep(
                plan,
                targets,
                client_options=client_options(args),
                preflight=not args.no_preflight,
                progress=None if args.quiet else sys.stderr,
                cells=cells,
                runtime_retries=args.retries_runtime or 0,
                resume=args.resume,
            )

    results = run_async(go)
    failed = sum(1 for r in results if r.status == "failed")
    print(safe_text(f"{len(results)} cells ({failed} failed) in {sweep.out}"), file=sys.stderr)
    return EXIT_RUN_FAILED if failed else 0


def sweep_values(
    args: argparse.Namespace, bench_cls: type[Benchmark] | None
) -> dict[str, list[object]]:
    """Each parameter's values from its flag and `-p`: a sweep axis's comma list is split (a
    value of a str axis that holds a comma goes in a sweep file's list); any other parameter
    keeps its value whole when it is a str (serve's `--slo a=1,b=2`), else a comma list is
    several values, which `plan_sweep` refuses naming the axes."""
    if bench_cls is None:
        specs: list[ParamSpec] = []
        axes: set[str] = set()
    else:
        bench = bench_cls()
        specs, axes = bench.parameters(), set(bench.sweep_axes())
    from metrale.matrix.sweep import split_list

    by_name = {s.name: s for s in specs}
    out: dict[str, list[object]] = {}
    for name, items in given_values(args, args.param, specs).items():
        spec = by_name.get(name)
        if name in axes or spec is None or spec.type != "str":
            out[name] = [v for item in items for v in split_list(item)]
        else:
            out[name] = [",".join(items)]
    return out


def _apply_runtime_flags(sweep: Sweep, bench: Benchmark, args: argparse.Namespace) -> None:
    """The runtime-shaping flags go to every runtime of the sweep (over a sweep file's
    `[runtime_options.NAME]`, key by key); with no runtime to shape they are refused."""
    flags = shaping_flags(args)
    if not flags:
        return
    names = list(sweep.runtimes)
    if not sweep.runtime_given and "runtime" in bench.options:
        default = bench.runtime_choice(None)
        names = [default.type] if default is not None else names
    real = [n for n in names if n != NO_RUNTIME]
    if not real:
        raise UsageError(
            f"runtime option(s) {', '.join(flags)} need a runtime to shape; the sweep runs in "
            "metrale's process (give --runtime NAME[,NAME])"
        )
    for runtime in real:
        sweep.runtime_options[runtime] = {
            **sweep.runtime_options.get(runtime, {}),
            **runtime_options(args, runtime),
        }


def widest(in_flight: list[int | None]) -> int | None:
    """One embedded server serves every cell of a tier: as many slots as its widest cell (None,
    unbounded, when any cell is)."""
    return None if None in in_flight else max(n for n in in_flight if n is not None)
