"""`metrale cleanup`: remove what killed runs left behind."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from metrale.cli.parsing import no_extra


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cleanup",
        help="remove what killed runs left: containers, bwrap workdirs and cgroups, remote "
        "sandboxes",
        description="Remove the sandboxes of runs that are no longer alive, as each runtime "
        "finds its own: docker containers with the metrale.sandbox label, bwrap workdirs and "
        "cgroups, a remote service's sandboxes labelled with a dead run. What a live run uses "
        "is kept. Exit 0, also when there is nothing to remove.",
    )
    p.add_argument(
        "--runtime",
        metavar="LIST",
        help="a comma list of runtimes to clean (default: every installed one that leaves "
        "anything behind and can be reached from here)",
    )
    p.add_argument("--docker-cli", metavar="CLI", default="docker")
    p.add_argument(
        "--all",
        action="store_true",
        dest="everything",
        help="also remove containers of live runs and of other hosts",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.fmt import safe_text
    from metrale.runtime.cleanup import cleanup

    no_extra(extra)
    names = [n.strip() for n in args.runtime.split(",") if n.strip()] if args.runtime else None
    options = {"docker": {"cli": args.docker_cli}}
    report = cleanup(names, options=options, everything=args.everything)
    for line in report.lines():
        print(safe_text(line))
    return 0
