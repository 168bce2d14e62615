"""How metrale writes a number for a person: one module for run's table, report, compare,
the live view and the HTML page, so the same value reads the same everywhere.

- Three significant figures, never scientific notation, trailing zeros dropped
  (`6.3`, `0.000912`, `1230`).
- A duration column is in one unit, chosen for the column: the unit (µs, ms or s) in which the
  column's largest p50 is at least 1 (`duration_unit`); for a column of spreads, one unit up
  while its largest p90 would take five digits or more (`spread_unit`: `0.899 (0.44–290)` ms,
  not `899 (440–290000)` µs). The unit goes in the column header (`generation (ms)`), not in
  the cells.
- A spread is `p50 (p10–p90)` (`6.3 (3.9–7.6)`), all three in the column's unit.
- A lone duration outside a table carries its own unit (`5.32 µs`, `373 ms`, `1.5 s`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Protocol

#: Seconds → the unit: multiply by the factor.
DURATION_UNITS: dict[str, float] = {"µs": 1e6, "ms": 1e3, "s": 1.0}
#: A declared metric's unit that is a duration, and its factor to seconds.
TO_SECONDS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


class SpreadLike(Protocol):
    p10: float | None
    p50: float | None
    p90: float | None


def sig(x: float | int | None, digits: int = 3) -> str:
    """`x` to `digits` significant figures as a plain decimal; `-` for None or NaN."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        # an integer count keeps every digit: 1024 rollouts are not "1020"
        return str(x)
    if x == 0:
        return "0"
    exponent = math.floor(math.log10(abs(x)))
    rounded = round(x, digits - 1 - exponent)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) > exponent:
        exponent += 1  # 9.996 rounds to 10.0: one place fewer
    places = max(0, digits - 1 - exponent)
    text = f"{rounded:.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def duration_unit(seconds: Iterable[float | None]) -> str:
    """The unit of a duration column: the largest of µs, ms, s in which the column's largest
    value is at least 1 (µs when every value is below 1 µs or the column is empty)."""
    top = max((abs(x) for x in seconds if x is not None and math.isfinite(x)), default=0.0)
    if top >= 1.0:
        return "s"
    if top >= 1e-3:
        return "ms"
    return "µs"


def in_unit(seconds: float | None, unit: str, digits: int = 3) -> str:
    """A duration in `unit` (no unit written): `-` when None."""
    if seconds is None:
        return "-"
    return sig(seconds * DURATION_UNITS[unit], digits)


def spread_text(spread: SpreadLike, unit: str, digits: int = 3) -> str:
    """`p50 (p10–p90)` in `unit`; `-` when any of the three is missing."""
    if spread.p50 is None or spread.p10 is None or spread.p90 is None:
        return "-"
    return (
        f"{in_unit(spread.p50, unit, digits)} "
        f"({in_unit(spread.p10, unit, digits)}–{in_unit(spread.p90, unit, digits)})"
    )


def spread_unit(spreads: Iterable[SpreadLike]) -> str:
    """The unit of a column of spreads: by its largest p50 (`duration_unit`), then one unit up
    while the largest p90 would read 10,000 or more in it (a tail 300x its median)."""
    items = list(spreads)
    unit = duration_unit(s.p50 for s in items)
    top = max((s.p90 for s in items if s.p90 is not None and math.isfinite(s.p90)), default=0.0)
    units = list(DURATION_UNITS)  # µs, ms, s
    while unit != "s" and abs(top) * DURATION_UNITS[unit] >= 1e4:
        unit = units[units.index(unit) + 1]
    return unit


def spread_column(spreads: Iterable[SpreadLike], digits: int = 3) -> tuple[str, list[str]]:
    """The unit of a column of spreads (`spread_unit`) and each cell's text in it."""
    items = list(spreads)
    unit = spread_unit(items)
    return unit, [spread_text(s, unit, digits) for s in items]


def duration_text(seconds: float | None, *, signed: bool = False, digits: int = 3) -> str:
    """A lone duration with its own unit: `250 µs`, `12.5 ms`, `1.5 s`; `+` when `signed` and
    positive; `-` when None."""
    if seconds is None:
        return "-"
    if seconds == 0:
        return "0 s"
    unit = duration_unit([seconds])
    text = f"{in_unit(seconds, unit, digits)} {unit}"
    return "+" + text if signed and seconds > 0 else text


def number_text(x: float | int | None, *, signed: bool = False, digits: int = 3) -> str:
    """A number of a declared metric in its own unit (reward, tokens/s, turns)."""
    text = sig(x, digits)
    if signed and x is not None and x > 0 and text != "-":
        return "+" + text
    return text


def rate_text(per_s: float | None) -> str:
    """Rollouts (or requests) per second, for the live view."""
    return "-" if per_s is None else f"{sig(per_s)}/s"


def clock_text(seconds: float | None) -> str:
    """A wall-clock span as `m:ss` (or `h:mm:ss`): elapsed and ETA in the live view."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-:--"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


# --------------------------------------------------------------------------- text from others

#: What a terminal would obey rather than show: C0 controls (ESC starts every escape sequence:
#: CSI, OSC — a window title, an OSC 52 clipboard write —, DCS), DEL, the C1 controls (0x9b
#: is a one-byte CSI for some terminals), and the bidirectional overrides and isolates that
#: make a line read differently from what it holds. Line separators (U+2028/9) too.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_CONTROL_NO_LINES = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: object, *, lines: bool = True) -> str:
    """`text` made harmless to print on a terminal: every control character (see `_CONTROL`)
    shown as its escape (`\\x1b`), so an escape sequence from a task, an image build, a
    model's answer or a run directory is printed, never obeyed. Newlines and tabs stay
    unless `lines` is False (a one-line field: a table cell, an error line).

    Every print of text metrale did not write itself goes through here."""
    pattern = _CONTROL if lines else _CONTROL_NO_LINES
    return pattern.sub(_escaped, str(text))


#: The characters `safe_json` writes as `\\uXXXX` (JSON already escapes the C0 controls).
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def safe_json(text: str) -> str:
    """A JSON document (as `json.dumps(..., ensure_ascii=False)` writes it) with the
    characters a terminal would obey written as `\\uXXXX` escapes: the same JSON value."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
