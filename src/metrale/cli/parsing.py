"""What every command's flags share: the parser whose errors are one line, and value types."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from metrale.errors import UsageError

_MISSING = re.compile(r"argument (--[\w-]+)(?:/\S+)?: expected one argument")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem and where help is.

    `value_hints` maps a flag to what it accepts, so that `--rollouts` given without a value
    says so and lists the accepted values, rather than argparse's bare 'expected one argument'.
    """

    value_hints: dict[str, str]

    def error(self, message: str) -> NoReturn:
        missing = _MISSING.match(message)
        hints = getattr(self, "value_hints", {})
        if missing and missing.group(1) in hints:
            flag = missing.group(1)
            raise UsageError(
                f"{flag} needs a value; accepted: {hints[flag]} (see '{self.prog} --help')"
            )
        raise UsageError(f"{message} (see '{self.prog} --help')")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0..65535)")
    return value


def out_dir(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; accepted: a directory path")
    return Path(text)


def no_extra(extra: Sequence[str]) -> None:
    if extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
