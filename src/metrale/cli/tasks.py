"""`metrale tasks check DIR...`: validate Harbor tasks (terminal_bench) without running them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.cli.parsing import no_extra


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tasks",
        help="check Harbor task directories (terminal_bench) without running them",
        description="Check task directories the way 'metrale run terminal_bench' reads them.",
    )
    actions = p.add_subparsers(dest="tasks_action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="layout, task.toml, FROM resolution, oracle presence, refused fields",
        description="One line per problem, then a count. Exit 0 when every task is runnable, "
        "1 when some are not, 2 on bad input. Nothing is built or started.",
    )
    check.add_argument(
        "dirs", nargs="+", type=Path, metavar="DIR", help="a task directory or a dataset"
    )
    check.add_argument(
        "--base-image",
        action="append",
        default=[],
        metavar="NAME=LOCAL",
        help="map a FROM image (NAME may be a glob) to a local one, as the run does",
    )
    check.add_argument(
        "--engine",
        metavar="CLI",
        nargs="?",
        const="docker",
        default=None,
        help="also ask this container CLI (default docker) which base images are present",
    )
    check.add_argument("-q", "--quiet", action="store_true", help="print only the count")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.benchmarks.terminal_bench.check import check_paths
    from metrale.benchmarks.terminal_bench.images import parse_base_images
    from metrale.fmt import safe_text

    no_extra(extra)
    mapping = parse_base_images(",".join(args.base_image))
    report = check_paths(args.dirs, mapping, engine=args.engine)
    lines = list(report.lines())
    for line in lines if not args.quiet else lines[-1:]:
        print(safe_text(line, lines=False), file=sys.stdout)
    return report.exit_code
