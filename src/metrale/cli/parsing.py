"""What every command's flags share: the parser whose errors are one line, and value types."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from metrale.bounds import PORT, Bound
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


def bounded(bound: Bound) -> Callable[[str], Any]:
    """An argparse type for a number flag within `bound` (`metrale.bounds`): NaN, infinities
    and values out of range are refused, and argparse's line names the flag and the range
    (`argument --timeout: 'nan': accepted: a number > 0 and <= 604800 (seconds)`)."""

    def parse(text: str) -> Any:
        try:
            return bound.parse(text, "value")
        except UsageError:
            raise argparse.ArgumentTypeError(f"{text!r}: accepted: {bound.accepted()}") from None

    parse.__name__ = "number"
    return parse


#: the generic number types of flags with nothing narrower declared (finite, below CEILING)
positive_float = bounded(Bound(0, lo_open=True))
non_negative_int = bounded(Bound(0, integer=True))
positive_int = bounded(Bound(1, integer=True))
port = bounded(PORT)


def out_dir(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; accepted: a directory path")
    return Path(text)


def no_extra(extra: Sequence[str]) -> None:
    if extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
