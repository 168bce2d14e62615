"""The `metrale` command: flags, exit codes, and choosing the target. No measuring here.

Exit codes: 0 done (verdict passed or none), 1 verdict failed, 2 usage error, 3 run failed.
A user's mistake is one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from metrale import __version__
from metrale.cli import cleanup, compare, exec, list, matrix, plot, report, run, sim
from metrale.cli.parsing import Parser
from metrale.errors import EXIT_USAGE, MetraleError

COMMANDS = (run, list, sim, matrix, report, plot, compare, exec, cleanup)


def build_parser() -> Parser:
    parser = Parser(prog="metrale", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"metrale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if getattr(args, "handler", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.handler(args, extra))
    except MetraleError as exc:
        print(f"metrale: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("metrale: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `metrale report DIR | head`: the reader left; say nothing more, as `cat` would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
