"""`metrale plot`: a sweep's figure, or a run's own (serve)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.cli.parsing import no_extra
from metrale.errors import UsageError
from metrale.fmt import safe_text


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="plot a sweep or a serve run directory (PNG, SVG or PDF)")
    p.add_argument(
        "dir", type=Path, metavar="DIR", help="a 'metrale matrix' or serve run directory"
    )
    p.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.{png,svg,pdf}")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Dispatch on what DIR holds: a sweep directory (cell files from `metrale matrix`), or the
    run directory of a benchmark that draws its own figure (`plugin.PlotsRuns`, e.g. serve's
    latency against throughput)."""
    from metrale.matrix import is_cell_dir
    from metrale.matrix.plot import figure_format
    from metrale.plugin import PlotsRuns, get_benchmark
    from metrale.rundir import run_benchmark_id

    no_extra(extra)
    figure_format(args.output)  # the format, from the extension, before any work
    bench_id = run_benchmark_id(args.dir)  # a run directory has a run.json; a sweep has none
    if bench_id is not None:
        bench: object = get_benchmark(bench_id)  # a class: its staticmethods meet PlotsRuns
        if not isinstance(bench, PlotsRuns):
            raise UsageError(
                f"{args.dir}: a {bench_id} run has no figure of its own; "
                "plot a 'metrale matrix' directory instead"
            )
        print(safe_text(f"wrote {bench.plot_run(args.dir, args.output)}"), file=sys.stderr)
        return 0
    if is_cell_dir(args.dir):
        from metrale.matrix.plot import plot_dir

        info = plot_dir(args.dir, args.output)
        wrote = f"wrote {info.path} ({info.width_px}x{info.height_px} px)"
        print(safe_text(wrote), file=sys.stderr)
        return 0
    raise UsageError(
        f"{args.dir}: nothing to plot; accepted: a 'metrale matrix' directory "
        "or a run directory of a benchmark that draws one (serve)"
    )
