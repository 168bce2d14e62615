"""What every command's flags share: the parser whose errors are one line, and value types."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from metrale.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem and where help is."""

    def error(self, message: str) -> NoReturn:
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
