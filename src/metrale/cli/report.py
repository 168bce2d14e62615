"""`metrale report`: the table of a sweep or a run, one row per cell."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.cli.parsing import no_extra


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="the table of a sweep or a run, one row per cell")
    p.add_argument(
        "dir", type=Path, metavar="DIR", help="a 'metrale matrix' directory or a run directory"
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="numbers as CSV (durations in seconds)")
    fmt.add_argument("--json", action="store_true", help="numbers as JSON (durations in seconds)")
    p.add_argument("--html", type=Path, metavar="FILE", help="also write a self-contained page")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.fmt import safe_text
    from metrale.matrix import cell_from_run_dir, is_run_dir, read_cells
    from metrale.matrix.report import failure_notes, render_report

    no_extra(extra)
    # a run directory is one row; a sweep directory a row per cell file
    cells = [cell_from_run_dir(args.dir)] if is_run_dir(args.dir) else read_cells(args.dir)
    if args.html is not None:
        from metrale.matrix.html import write_html

        written = write_html(args.dir, cells, args.html)
        print(safe_text(f"wrote {written}"), file=sys.stderr)
    style = "csv" if args.csv else "json" if args.json else "markdown"
    print(safe_text(render_report(cells, style)))
    if args.csv or args.json:
        for note in failure_notes(cells):
            print(note, file=sys.stderr)
    return 0
