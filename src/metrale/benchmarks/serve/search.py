"""Capacity search: the largest load that meets each SLO tier, by bracketing then bisection.

The load is one axis (`lanes` for load=sessions, `concurrency`, or `rate`) on a grid from LOW to
HIGH in steps of STEP (1 for lanes and concurrency). For each tier:

1. **bracket**: measure LOW (failing it: the tier has no capacity in the range) and HIGH
   (passing it: the capacity is at least HIGH);
2. **bisect** between the highest passing and the lowest failing grid point until they are one
   step apart: the **boundary** is the highest passing load.

Levels are measured once and shared by the tiers. One tier takes at most
2 + ⌈log2((HIGH − LOW) / STEP)⌉ levels. A level that has already failed every tier stops early
(`slo.OverSaturation`), so an over-saturated HIGH costs little. The result per tier: the
boundary, the request throughput, goodput and session goodput measured there, the interval
(the boundary and the failing level above it), and each criterion's bootstrap interval at the
boundary (95%, from resampling the boundary level's requests or sessions).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from metrale.benchmarks.serve.slo import Tier, TierOutcome
from metrale.errors import UsageError

AXES = ("lanes", "concurrency", "rate")
#: which --load each search axis varies
LOAD_OF_AXIS = {"lanes": "sessions", "concurrency": "concurrency", "rate": "rate"}


@dataclass(frozen=True)
class SearchSpec:
    axis: str
    low: float
    high: float
    step: float

    def grid(self, k: int) -> float:
        """The k-th load of the grid (an int for lanes and concurrency)."""
        value = self.low + k * self.step
        return float(round(value)) if self.axis != "rate" else round(value, 9)

    @property
    def points(self) -> int:
        """The grid's last index: HIGH is grid(points)."""
        return math.ceil((self.high - self.low) / self.step - 1e-9)

    @property
    def max_levels(self) -> int:
        return 2 + math.ceil(math.log2(self.points)) if self.points > 1 else 2


def parse_search(axis: str, text: str, step: float | None) -> SearchSpec:
    """`--search AXIS --search-range LOW:HIGH [--search-step S]`; one UsageError otherwise."""
    accepted = "give --search-range LOW:HIGH with LOW < HIGH"
    low_text, colon, high_text = text.partition(":")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise UsageError(f"search range {text!r} is not LOW:HIGH; {accepted}") from None
    if not colon or not (math.isfinite(low) and math.isfinite(high)):
        raise UsageError(f"search range {text!r} is not LOW:HIGH; {accepted}")
    if axis in ("lanes", "concurrency"):
        if low != int(low) or high != int(high) or low < 1:
            raise UsageError(f"search range {text!r}: {axis} are whole numbers >= 1")
        step = 1.0 if step is None else step
        if step != int(step):
            raise UsageError(f"search step {step:g}: {axis} step by whole numbers")
    elif low <= 0:
        raise UsageError(f"search range {text!r}: a rate must be > 0")
    if high <= low:
        raise UsageError(f"search range {text!r} is empty; {accepted}")
    step = (high - low) / 32 if step is None else step
    if step <= 0 or step > high - low:
        raise UsageError(f"search step {step:g} must be > 0 and at most HIGH - LOW")
    return SearchSpec(axis, low, high, step)


class Boundary(BaseModel):
    """One tier's answer."""

    tier: str
    criteria: str
    boundary: float | None = Field(None, description="highest load that passed; None: LOW failed")
    above: float | None = Field(None, description="lowest load that failed; None: HIGH passed")
    request_throughput: float | None = None
    goodput: float | None = None
    session_goodput: float | None = None
    bootstrap: dict[str, list[float]] = Field(
        default_factory=dict, description="criterion -> [low, high] 95% at the boundary"
    )


class SearchResult(BaseModel):
    axis: str
    low: float
    high: float
    step: float
    levels: int = 0
    tiers: list[Boundary] = Field(default_factory=list)


@dataclass
class Measured:
    """What the search needs of one measured level."""

    index: int
    outcomes: dict[str, TierOutcome]
    metrics: dict[str, float | int | None]


Measure = Callable[[float], Awaitable[Measured]]
Bootstrap = Callable[[Tier, int], dict[str, list[float]]]


async def capacity_search(
    spec: SearchSpec, tiers: Sequence[Tier], measure: Measure, bootstrap: Bootstrap
) -> SearchResult:
    """Find each tier's boundary on `spec`'s grid; `measure(load)` runs one level."""
    cache: dict[int, Measured] = {}

    async def at(k: int) -> Measured:
        if k not in cache:
            cache[k] = await measure(spec.grid(k))
        return cache[k]

    result = SearchResult(axis=spec.axis, low=spec.low, high=spec.high, step=spec.step)
    for tier in tiers:
        last = spec.points

        async def passes(k: int, tier: Tier = tier) -> bool:
            return (await at(k)).outcomes[tier.name].passed

        good: int | None = None
        bad: int | None = None
        if not await passes(0):
            bad = 0
        elif await passes(last):
            good = last
        else:
            good, bad = 0, last
            while bad - good > 1:
                mid = (good + bad) // 2
                if await passes(mid):
                    good = mid
                else:
                    bad = mid
        answer = Boundary(tier=tier.name, criteria=tier.text)
        if bad is not None:
            answer.above = spec.grid(bad)
        if good is not None:
            level = cache[good]
            answer.boundary = spec.grid(good)
            answer.request_throughput = _float(level.metrics.get("request_throughput"))
            answer.goodput = level.outcomes[tier.name].goodput
            answer.session_goodput = level.outcomes[tier.name].session_goodput
            answer.bootstrap = bootstrap(tier, level.index)
        result.tiers.append(answer)
    result.levels = len(cache)
    return result


def _float(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None
