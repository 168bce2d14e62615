"""Declared metrics: every number a benchmark reports, declared once with its unit and direction.

A `Metric` is a name, a unit, which direction is better, a statistic and the per-unit value it is
taken over (a unit is one rollout record, or one request for serve); its `doc` holds the formula.
The summary of a run keeps, per declared metric, the sample it was computed from, so that
`compare` can bootstrap the same statistic and `report`, `plot` and budgets read the same number:

- `mean`, `sum`, `max`: the mean, sum or largest of the per-unit values (a rate is the mean of
  0/1 values);
- `p50`, `p90`, `p99`: percentiles (linear interpolation, `metrale.stats.percentile`);
- `ratio`: sum(value) / sum(per) over the units that have both (e.g. seconds per turn), the
  sample then being (value, per) pairs;
- `value`: one number for the whole run (e.g. e2e), no sample and so no interval.

Units without a value (None) are left out of the sample. This module does no I/O.

A summary stores each metric's `MetricDeclaration` (the declaration without its code), so a
results file is read with the declarations it was written with, not the installed benchmark's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel

from metrale.errors import UsageError
from metrale.stats import mean, percentile

Stat = Literal["mean", "sum", "max", "p50", "p90", "p99", "ratio", "value"]
Better = Literal["lower", "higher"]
#: What one sample is a list of: floats, or (value, per) pairs for a ratio.
Sample = Sequence[float] | Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Metric:
    """One declared number. `value(unit)` gives the unit's contribution (None: not counted);
    `per(unit)` the denominator of a ratio. A metric with no `value` has its sample given by
    the benchmark (serve's batch means). `column` puts it in the report table."""

    name: str
    unit: str
    better: Better | None
    doc: str
    stat: Stat = "mean"
    value: Callable[[Any], float | None] | None = None
    per: Callable[[Any], float | None] | None = None
    column: bool = False

    def __post_init__(self) -> None:
        if self.per is not None and self.stat != "ratio":
            raise ValueError(f"metric {self.name}: only a ratio has `per`")
        if self.stat == "ratio" and self.value is not None and self.per is None:
            raise ValueError(f"metric {self.name}: a ratio with a per-unit value needs `per`")
        if self.stat == "value" and self.value is not None:
            raise ValueError(f"metric {self.name}: a whole-run value has no per-unit `value`")

    def declaration(self) -> MetricDeclaration:
        return MetricDeclaration(
            name=self.name, unit=self.unit, better=self.better, stat=self.stat,
            column=self.column, doc=self.doc,
        )  # fmt: skip

    @property
    def lower_is_better(self) -> bool:
        return self.better == "lower"

    def sample_of(self, unit: Any) -> float | tuple[float, float] | None:
        """This unit's entry in the sample, or None when it has none."""
        if self.value is None:
            return None
        x = self.value(unit)
        if x is None:
            return None
        if self.per is None:
            return float(x)
        d = self.per(unit)
        return None if d is None else (float(x), float(d))

    def compute(self, sample: Sample) -> float | None:
        """The statistic over `sample`; None when it is empty (or a ratio's denominator is 0)."""
        return compute(self.stat, sample)


class MetricDeclaration(BaseModel):
    """What a results file says of one metric: everything report, compare, plot and the HTML
    page need to show and judge it (its sample is in the summary beside it)."""

    name: str
    unit: str
    better: Better | None
    stat: Stat
    column: bool = False
    doc: str = ""

    def metric(self) -> Metric:
        """The declaration as a `Metric` with no per-unit code: it computes its statistic over
        a stored sample, which is all a reader of a file does."""
        return Metric(
            name=self.name, unit=self.unit, better=self.better, doc=self.doc, stat=self.stat,
            column=self.column,
        )  # fmt: skip


def compute(stat: Stat, sample: Sample) -> float | None:
    if stat == "value":
        return None
    if not sample:
        return None
    if stat == "ratio":
        pairs = cast("Sequence[tuple[float, float]]", sample)  # a ratio samples (num, den)
        den = sum(p[1] for p in pairs)
        return sum(p[0] for p in pairs) / den if den else None
    values = cast("Sequence[float]", sample)
    if stat == "mean":
        return mean(values)
    if stat == "sum":
        return float(sum(values))
    if stat == "max":
        return float(max(values))
    q = {"p50": 50.0, "p90": 90.0, "p99": 99.0}[stat]
    return percentile(sorted(values), q)


def find_metric(metrics: Sequence[Metric], name: str, *, what: str, benchmark: str) -> Metric:
    """The declared metric `name`, or a UsageError that lists every declared one."""
    for m in metrics:
        if m.name == name:
            return m
    accepted = ", ".join(m.name for m in metrics) or "(none)"
    raise UsageError(f"{what} {name!r}: {benchmark} declares no such metric; accepted: {accepted}")
