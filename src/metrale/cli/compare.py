"""`metrale compare`: B against A per declared metric and stage."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.bounds import Bound
from metrale.cli.parsing import bounded, no_extra
from metrale.errors import UsageError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="B vs A per metric and stage, with bootstrap 95%% intervals and a verdict",
        description="A and B: two cell files, two sweep directories (cells matched by name) "
        "or two run directories. Exit 1 when any row is worse.",
    )
    p.add_argument("a", type=Path, metavar="A")
    p.add_argument("b", type=Path, metavar="B")
    p.add_argument(
        "--tolerance",
        type=bounded(Bound(0, 1, unit="fraction of A")),
        default=0.05,
        metavar="FRACTION",
        help="differences below this fraction of A are 'same' (default 0.05)",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="compare only these declared metrics (repeatable; default: all)",
    )
    p.add_argument("--csv", action="store_true", help="CSV instead of a plain table")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.errors import EXIT_VERDICT_FAILED
    from metrale.fmt import safe_text
    from metrale.matrix.compare import compare_paths, render_comparison

    no_extra(extra)
    if not 0 <= args.tolerance < 1:
        raise UsageError(f"--tolerance {args.tolerance} is outside 0..1")
    names = [n.strip() for item in args.metric for n in item.split(",") if n.strip()]
    result = compare_paths(args.a, args.b, rel_tol=args.tolerance, names=names)
    print(safe_text(render_comparison(result, "csv" if args.csv else "plain")))
    return EXIT_VERDICT_FAILED if result.worse else 0
