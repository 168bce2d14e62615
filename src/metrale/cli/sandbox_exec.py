"""`metrale exec`: one command in a fresh sandbox."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from metrale.bounds import TIMEOUT_S
from metrale.cli.aio import run_async
from metrale.cli.parsing import bounded, no_extra
from metrale.cli.runtime_flags import add_runtime_args, runtime_from_args
from metrale.errors import RunError, UsageError
from metrale.fmt import safe_text


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "exec",
        help="run one command in a fresh sandbox",
        description="Start a fresh sandbox, run COMMAND in it, print its output, stop the "
        "sandbox; exit with the command's exit code (124 on timeout).",
    )
    add_runtime_args(p)
    p.add_argument("--timeout", type=bounded(TIMEOUT_S), metavar="S", help="seconds (default none)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.runtime import check_runtime, create_runtime

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    no_extra(extra)
    if not args.runtime:
        raise UsageError("metrale exec needs --runtime NAME (subprocess, bwrap, docker, ray)")
    if not command:
        raise UsageError("metrale exec needs a command after --")
    config = runtime_from_args(args)
    if config is None:
        raise UsageError("metrale exec needs a sandbox: --runtime subprocess, bwrap, docker or ray")
    check_runtime(config)

    async def go() -> int:
        from metrale.runtime import RuntimeStartError

        try:
            async with create_runtime(config) as sandbox:
                result = await sandbox.run(command, timeout=args.timeout)
        except RuntimeStartError as exc:
            raise RunError(f"sandbox did not start: {exc}") from None
        for stream, text in ((sys.stdout, result.stdout), (sys.stderr, result.stderr)):
            stream.write(_shown(stream, text))
            stream.flush()
        return 124 if result.timed_out else result.exit_code

    try:
        return run_async(go)
    except FileNotFoundError as exc:
        raise RunError(f"cannot start the sandbox: {exc}") from None
    except RuntimeError as exc:
        raise RunError(f"sandbox failed: {exc}") from None


def _shown(stream: TextIO, text: str) -> str:
    """The command's output as it is into a pipe or a file (it is the user's data), and with
    its control sequences escaped on a terminal (`fmt.safe_text`): a sandboxed command must not
    set the title, write the clipboard or clear the screen of the user's terminal."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return safe_text(text) if terminal else text
