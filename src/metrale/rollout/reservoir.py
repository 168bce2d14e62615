"""A metric's sample while rollouts run: exact totals, and at most `cap` values kept.

A run of a million rollouts must not hold a million numbers per metric: memory is to grow with
the rollouts in flight, not with the rollouts done. So each metric keeps, exactly, its count,
sum and maximum (a ratio's two sums), which is all a mean, sum, max or ratio needs, and keeps
its values only up to `cap`; past that, a uniform sample of them (Vitter's algorithm R: the
n-th value replaces a kept one with probability cap / n). Percentiles and compare's bootstrap
read the kept values: exact up to `cap` rollouts, a uniform sample of `cap` of them beyond (at
16,384 the p50's rank is within 0.4% of the true one with 95% confidence; compare's interval,
computed from `cap` values, is if anything wider than the whole run's would be).

The replacement draws come from a generator seeded by the metric's name: the same records in
the same order keep the same sample.
"""

from __future__ import annotations

import random
import zlib
from array import array
from typing import Any

from metrale.plugin.metrics import Stat, compute

#: Values kept per metric (8 bytes each; a ratio keeps this many pairs).
SAMPLE_CAP = 16_384


class Reservoir:
    """The values of one metric (pairs, `width=2`, for a ratio) over the finished rollouts."""

    __slots__ = ("_rng", "cap", "n", "name", "per", "top", "total", "values", "width")

    def __init__(self, name: str, *, width: int = 1, cap: int = SAMPLE_CAP) -> None:
        self.name, self.cap, self.width = name, cap, width
        self.values: array[float] = array("d")
        self.n = 0
        #: the sum of the values (a ratio's numerators), and of a ratio's denominators
        self.total = 0.0
        self.per = 0.0
        #: the largest value (of a plain metric)
        self.top: float | None = None
        self._rng = random.Random(zlib.crc32(name.encode()))

    def add(self, x: float | tuple[float, float]) -> None:
        self.n += 1
        xs: tuple[float, ...]
        if isinstance(x, tuple):
            value, per = x
            self.total += value
            self.per += per
            xs = x
        else:
            self.total += x
            if self.top is None or x > self.top:
                self.top = x
            xs = (x,)
        if self.n <= self.cap:
            self.values.extend(xs)
            return
        slot = self._rng.randrange(self.n)
        if slot < self.cap:
            self.values[slot * self.width : (slot + 1) * self.width] = array("d", xs)

    @property
    def sampled(self) -> bool:
        """Whether the kept values are a sample of more (`n` > `cap`)."""
        return self.n > self.cap

    def kept(self) -> Any:
        """The kept values (the array itself), or (value, per) pairs for a ratio."""
        if self.width == 1:
            return self.values
        return list(zip(self.values[0::2], self.values[1::2], strict=True))

    def statistic(self, stat: Stat) -> float | None:
        """`stat` over every value added: exact for mean, sum, max and ratio; a percentile
        from the kept values. None when nothing was added (or a ratio's denominator is 0)."""
        if not self.n:
            return None
        if stat == "mean":
            return self.total / self.n
        if stat == "sum":
            return self.total
        if stat == "max":
            return self.top
        if stat == "ratio":
            return self.total / self.per if self.per else None
        return compute(stat, self.values)

    def __len__(self) -> int:
        """The values kept (the sample's size, not `n`)."""
        return len(self.values) // self.width
