"""Percentiles, stage summaries and bootstrap intervals: defined once, used everywhere.

Percentiles use linear interpolation between closest ranks (numpy's default "linear" method,
Hyndman & Fan type 7): for sorted values x[0..n-1] and q in [0, 100], the rank is
h = (n - 1) * q / 100 and the percentile is
x[floor(h)] + (h - floor(h)) * (x[ceil(h)] - x[floor(h)]).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from pydantic import BaseModel


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values` by linear interpolation; None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not values:
        return None
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = math.ceil(h)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Spread(BaseModel):
    """p50 with its p10–p90 range: how metrale reports every stage duration."""

    n: int
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls(n=0)
        return cls(
            n=len(values),
            p10=percentile(values, 10),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            mean=mean(values),
            min=min(values),
            max=max(values),
        )

    def cell(self, unit: str | None = None, digits: int = 3) -> str:
        """`p50 (p10–p90)` in `unit` (µs, ms or s; default: the one it reads best in,
        `metrale.fmt.spread_unit`), three significant figures; `-` when empty. The form of
        every stage column (`metrale.fmt`)."""
        from metrale.fmt import spread_text, spread_unit

        return spread_text(self, unit or spread_unit([self]), digits)


class Interval(BaseModel):
    """A point estimate with its bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    level: float = 0.95


def bootstrap_diff(
    a: Sequence[float],
    b: Sequence[float],
    stat: Callable[[Sequence[float]], float | None] = lambda xs: percentile(xs, 50),
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """The difference stat(b) - stat(a) with a percentile-bootstrap interval.

    Each resample draws len(a) values from a and len(b) from b with replacement, independently;
    the interval is the (1-level)/2 and (1+level)/2 percentiles of the resampled differences.
    ValueError when either sample is empty, or when `stat` has no value (None) on a sample or
    on one of its resamples (a ratio whose resampled denominators are all 0).
    """
    if not a or not b:
        raise ValueError("bootstrap needs two non-empty samples")
    rng = random.Random(seed)
    point = _num(stat(b)) - _num(stat(a))
    diffs = []
    for _ in range(resamples):
        ra = rng.choices(a, k=len(a))
        rb = rng.choices(b, k=len(b))
        diffs.append(_num(stat(rb)) - _num(stat(ra)))
    alpha = (1 - level) / 2 * 100
    return Interval(
        estimate=point,
        low=_num(percentile(diffs, alpha)),
        high=_num(percentile(diffs, 100 - alpha)),
        level=level,
    )


def _num(x: float | None) -> float:
    if x is None:
        raise ValueError("the statistic has no value on a sample or one of its resamples")
    return x


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased estimate of pass@k from `n` attempts of which `c` passed (Chen et al.,
    2021): 1 - C(n-c, k) / C(n, k), the chance that k attempts drawn without replacement
    from the n include a pass. None when k > n (too few attempts to say) or k < 1."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: {c} passes out of {n} attempts")
    if k < 1 or k > n:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
