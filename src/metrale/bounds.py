"""The one validation of every number a user, a task or a file gives metrale: finite, within a
stated range, and refused with one line naming the field and that range.

Why one: NaN compares false with everything, so `value <= 0` lets it through, and a timeout of
NaN or a memory limit of 1 MB passed every check and then failed every rollout, or hung. Each
`Bound` is declared once here and used by the CLI's flag types (`cli.parsing.bounded`), the
runtime configs' fields (`pydantic_range`), task.toml (`terminal_bench.task`), budgets and
benchmark parameters (`plugin.params`), so a value is judged the same wherever it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from metrale.errors import UsageError

#: The largest magnitude any number may have where nothing narrower is declared: finite, and
#: far past anything meaningful (a timeout of 31,000 years, 10^12 rollouts).
CEILING = 1e12


@dataclass(frozen=True)
class Bound:
    """A range for a number: `lo` (excluded when `lo_open`) to `hi`, an integer or not."""

    lo: float
    hi: float = CEILING
    integer: bool = False
    lo_open: bool = False
    unit: str = ""

    def accepted(self) -> str:
        kind = "an integer" if self.integer else "a number"
        lo, hi = _num(self.lo), _num(self.hi)
        span = f"> {lo} and <= {hi}" if self.lo_open else f"{lo}..{hi}"
        return f"{kind} {span}" + (f" ({self.unit})" if self.unit else "")

    def check(self, value: object, field: str) -> Any:
        """`value` as an int or float within the range, else `UsageError` naming `field`."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{field} = {value!r} is not a number; accepted: {self.accepted()}")
        if self.integer and isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                raise UsageError(f"{field} = {value!r}; accepted: {self.accepted()}")
            value = int(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{field} = {value!r}; accepted: {self.accepted()}")
        low = value <= self.lo if self.lo_open else value < self.lo
        if low or value > self.hi:
            raise UsageError(f"{field} = {value!r} is out of range; accepted: {self.accepted()}")
        return value

    def parse(self, text: str, field: str) -> Any:
        """A CLI string checked as `check` does (`1_000` and `1e3` read as numbers)."""
        raw = text.strip()
        try:
            value: float | int = int(raw.replace("_", "")) if self.integer else float(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                raise UsageError(
                    f"{field} = {text!r} is not a number; accepted: {self.accepted()}"
                ) from None
        return self.check(value, field)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else str(x)


def pydantic_range(bound: Bound) -> dict[str, Any]:
    """`Field(**pydantic_range(b))`: the same range on a pydantic field, NaN/inf refused."""
    low = {"gt": bound.lo} if bound.lo_open else {"ge": bound.lo}
    extra = {} if bound.integer else {"allow_inf_nan": False}
    return {**low, "le": bound.hi, **extra}


# --------------------------------------------------------------------------- the bounds

DAY_S = 86400.0
#: A timeout of any command, call, build or phase: above 0, at most a week.
TIMEOUT_S = Bound(0, 7 * DAY_S, lo_open=True, unit="seconds")
#: A delay the simulator adds: 0 up to an hour.
DELAY_S = Bound(0, 3600, unit="seconds")
FRACTION = Bound(0, 1)
#: Memory of a sandbox or of one of its processes: below 32 MB not even a shell starts.
MEMORY_MB = Bound(32, 16 * 2**20, integer=True, unit="MB")
#: The size of a sandbox's tmpfs.
TMPFS_MB = Bound(1, 16 * 2**20, integer=True, unit="MB")
#: Largest file a process may write (RLIMIT_FSIZE): up to 16 TB (ext4's largest file).
FILE_SIZE_MB = Bound(1, 16 * 2**20, integer=True, unit="MB")
#: Processes of a sandbox: a shell running one command needs a few (init, sh, the command).
MAX_PROCS = Bound(4, 2**22, integer=True)
CPU_S = Bound(1, 366 * DAY_S, integer=True, unit="CPU seconds")
CPUS = Bound(0.01, 4096, unit="CPUs")
#: A count of retries, sandboxes, slots: 0 up to a million.
COUNT = Bound(0, 10**6, integer=True)
RATE_PER_S = Bound(0, 10**6, lo_open=True, unit="per second")
BYTES = Bound(0, 2**40, integer=True, unit="bytes")
KIB = Bound(0, 2**30, integer=True, unit="KiB")
PORT = Bound(0, 65535, integer=True)
SEED = Bound(-(2**63), 2**63 - 1, integer=True)
TOKENS = Bound(0, 10**7, integer=True, unit="tokens")
TOKENS_PER_S = Bound(0, 10**9, unit="tokens/s")
