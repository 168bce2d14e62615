"""SLOs: per-request limits (`ttft_ms=200`) and **tiers** of percentile criteria.

`--slo` holds comma-separated parts (a repeated `--slo` joins with commas); `;` also separates:

- `KEY=MS` (`ttft_ms`, `tpot_ms`, `e2e_ms`, `itl_ms`): a per-request limit, as before: a request
  meets the SLOs when it is within every limit (`metrics.meets_slos`); goodput counts those.
- `METRIC OP VALUE[UNIT]` (OP one of `<=`, `<`, `>=`, `>`): a criterion of a **tier**, judged on
  a whole load level. METRIC is `ttft|tpot|itl|e2e` + `_p<Q>` (the Q-th percentile over the
  level's successful requests, any Q in 0..100; `ttft_p95`), or any metric serve declares
  (`session_goodput`, `error_rate`, `ttft_ms_p99_turn2_4`, ...). UNIT is `ms` or `s` for times,
  `%` for fractions; a bare number is in the metric's own unit (ms for the latency series).
- `NAME:` before a criterion starts a new tier called NAME; criteria without one are tier `slo`.

Within a tier, a request meets the tier when it meets the per-request limits and every `<=` /
`<` latency criterion's limit (`ttft_p95<=2s` makes 2 s a per-request TTFT limit), and the
tier's goodput-like metrics (`goodput`, `goodput_fraction`, `session_goodput`) are computed with
those limits. A level **passes** a tier when every criterion holds; its **attainment** is the
fraction of measured sessions (load=sessions) or requests meeting the tier.
"""

from __future__ import annotations

import math
import operator
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from metrale.benchmarks.serve.load import LevelState
from metrale.benchmarks.serve.metrics import (
    SLO_KEYS,
    RequestRecord,
    itl_samples,
    meets_slos,
    summarize,
    tpot,
)
from metrale.benchmarks.serve.session_metrics import summarize_sessions
from metrale.errors import UsageError
from metrale.plugin import Metric
from metrale.stats import percentile

SERIES: dict[str, Callable[[RequestRecord], list[float]]] = {
    "ttft": lambda r: [r.ttft_s * 1000] if r.ttft_s is not None else [],
    "tpot": lambda r: [x * 1000] if (x := tpot(r)) is not None else [],
    "itl": lambda r: [x * 1000 for x in itl_samples(r)],
    "e2e": lambda r: [r.e2e_s * 1000] if r.e2e_s is not None else [],
}
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
}  # fmt: skip
_CRITERION = re.compile(r"^([A-Za-z0-9_.]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*(ms|s|%)?$")
_PERCENTILE = re.compile(r"^(ttft|tpot|itl|e2e)(?:_ms)?_p(\d+(?:\.\d+)?)$")
_ACCEPTED = (
    "accepted: KEY=MS (ttft_ms, tpot_ms, e2e_ms, itl_ms), or [TIER:]METRIC OP VALUE[ms|s|%] "
    "with OP <=, <, >=, > (e.g. ttft_p95<=2s,tpot_p50<=60ms,session_goodput>=0.95)"
)


@dataclass(frozen=True)
class Criterion:
    """One judged number: the metric's value at a level, compared with `limit`."""

    text: str
    metric: str
    op: str
    limit: float
    series: str | None = None
    q: float | None = None

    def holds(self, value: float | None) -> bool:
        return value is not None and _OPS[self.op](value, self.limit)

    @property
    def request_limit_ms(self) -> tuple[str, float] | None:
        """The per-request limit this criterion implies (an upper bound on a latency)."""
        if self.series is None or self.op not in ("<=", "<"):
            return None
        return f"{self.series}_ms", self.limit


@dataclass(frozen=True)
class Tier:
    name: str
    criteria: tuple[Criterion, ...] = field(default_factory=tuple)

    def request_slos(self, base: Mapping[str, float]) -> dict[str, float]:
        """Per-request limits (ms) of this tier: the run's, tightened by its latency criteria."""
        slos = dict(base)
        for c in self.criteria:
            if (limit := c.request_limit_ms) is not None:
                key, ms = limit
                slos[key] = min(ms, slos.get(key, math.inf))
        return slos

    @property
    def text(self) -> str:
        return ",".join(c.text for c in self.criteria)


class TierOutcome(BaseModel):
    """One tier at one level: passed or not, each criterion's value, the attainment."""

    passed: bool
    attainment: float | None = None
    values: dict[str, float | None] = Field(default_factory=dict)
    #: requests meeting the tier / measured window (req/s), and sessions meeting it / sessions
    goodput: float | None = None
    session_goodput: float | None = None


def _number(text: str, part: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"slo {part!r}: {text!r} is not a number; {_ACCEPTED}") from None
    if not math.isfinite(value):
        raise UsageError(f"slo {part!r}: {text!r} is not a finite number")
    return value


def _criterion(part: str, metrics: Sequence[Metric]) -> Criterion:
    m = _CRITERION.match(part)
    if m is None:
        raise UsageError(f"slo {part!r} is malformed; {_ACCEPTED}")
    name, op, number, unit = m.groups()
    value = _number(number, part)
    if (p := _PERCENTILE.match(name)) is not None:
        q = float(p.group(2))
        if not 0 <= q <= 100:
            raise UsageError(f"slo {part!r}: percentile {q:g} is not within 0..100")
        if unit == "%":
            raise UsageError(f"slo {part!r}: a latency takes ms or s, not %")
        ms = value * 1000 if unit == "s" else value
        return Criterion(part, name, op, ms, series=p.group(1), q=q)
    declared = {d.name: d for d in metrics}
    if name not in declared:
        raise UsageError(
            f"slo {part!r}: serve declares no metric {name!r}; accepted: ttft|tpot|itl|e2e_pQ "
            f"or a declared metric ({', '.join(sorted(declared))})"
        )
    have = declared[name].unit
    if unit == "%":
        value /= 100
    elif unit is not None:
        if have not in ("ms", "s"):
            raise UsageError(f"slo {part!r}: {name} is in {have}, not a time")
        value *= {("s", "ms"): 1000.0, ("ms", "s"): 0.001}.get((unit, have), 1.0)
    return Criterion(part, name, op, value)


def parse_slo(text: str, metrics: Sequence[Metric]) -> tuple[dict[str, float], list[Tier]]:
    """`--slo`'s text -> (per-request limits in ms, tiers); one UsageError line otherwise."""
    limits: dict[str, float] = {}
    tiers: dict[str, list[Criterion]] = {}
    current = "slo"
    for raw in re.split(r"[,;]", text):
        part = raw.strip()
        if not part:
            continue
        head, colon, rest = part.partition(":")
        if colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", head.strip()):
            current, part = head.strip(), rest.strip()
            tiers.setdefault(current, [])
            if not part:
                continue
        if "=" in part and not re.search(r"<=|>=", part):
            key, _, value = part.partition("=")
            key = key.strip()
            if key not in SLO_KEYS:
                raise UsageError(
                    f"slo {part!r} is not KEY=MS; accepted keys: {', '.join(SLO_KEYS)}; or a "
                    "tier criterion METRIC OP VALUE (e.g. ttft_p95<=2s)"
                )
            limits[key] = _number(value.strip(), part)
            if limits[key] <= 0:
                raise UsageError(f"slo {part!r} must be a positive number of ms")
            continue
        tiers.setdefault(current, []).append(_criterion(part, metrics))
    empty = [name for name, cs in tiers.items() if not cs]
    if empty:
        raise UsageError(f"slo tier {empty[0]!r} has no criterion; {_ACCEPTED}")
    return limits, [Tier(name, tuple(cs)) for name, cs in tiers.items()]


def criterion_value(
    c: Criterion, records: Sequence[RequestRecord], metrics: Mapping[str, float | int | None]
) -> float | None:
    """The criterion's number at a level: a percentile of a series (ms) over the successful
    measured requests, or the level's declared metric (computed with the tier's limits)."""
    if c.series is None:
        value = metrics.get(c.metric)
        return None if value is None else float(value)
    assert c.q is not None
    values = [x for r in records if r.phase == "measure" and r.ok for x in SERIES[c.series](r)]
    return percentile(values, c.q)


def tier_metrics(
    tier: Tier, records: Sequence[RequestRecord], base: Mapping[str, float]
) -> dict[str, float | int | None]:
    """The level's metrics with this tier's per-request limits (goodput and session goodput
    count what meets the tier)."""
    slos = tier.request_slos(base)
    metrics = summarize(records, percentiles=(), slos=slos)
    if any(r.session is not None for r in records):
        metrics.update(summarize_sessions(records, slos))
    return metrics


def evaluate(
    tier: Tier,
    records: Sequence[RequestRecord],
    base: Mapping[str, float],
    level_metrics: Mapping[str, float | int | None],
) -> TierOutcome:
    """Whether one level meets `tier`, each criterion's value, and the attainment."""
    metrics = {**level_metrics, **tier_metrics(tier, records, base)}
    values = {c.text: criterion_value(c, records, metrics) for c in tier.criteria}
    sessions = metrics.get("sessions")
    attainment = metrics.get("session_goodput" if sessions else "goodput_fraction")
    return TierOutcome(
        passed=all(c.holds(values[c.text]) for c in tier.criteria),
        attainment=_float(attainment),
        values=values,
        goodput=_float(metrics.get("goodput")),
        session_goodput=_float(metrics.get("session_goodput")) if sessions else None,
    )


def _float(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None


class OverSaturation:
    """Tells a level to stop once it has failed every tier whatever its remaining requests do.

    With `planned` measured requests (or sessions, for `session_goodput`), a criterion
    `<series>_pQ <= L` is lost once more than (1 − Q/100)·planned + 1 successful requests
    exceeded L (percentiles are over successful requests); `session_goodput >= G` once more than
    (1 − G)·planned sessions missed a turn. Other criteria never stop a level early. Counting is
    incremental: each record is looked at once.
    """

    def __init__(
        self, tiers: Sequence[Tier], base: Mapping[str, float], planned: int | None,
        planned_sessions: int | None,
    ) -> None:  # fmt: skip
        self.tiers, self.base = list(tiers), dict(base)
        self.planned, self.planned_sessions = planned, planned_sessions
        self._seen = 0
        self._over = [[0] * len(t.criteria) for t in self.tiers]
        self._missed: list[set[str]] = [set() for _ in self.tiers]

    def __call__(self, state: LevelState) -> str | None:
        records = state.measured
        for r in records[self._seen :]:
            for i, tier in enumerate(self.tiers):
                for j, c in enumerate(tier.criteria):
                    if c.series is not None and c.op in ("<=", "<"):
                        self._over[i][j] += r.ok and any(
                            not c.holds(x) for x in SERIES[c.series](r)
                        )
                if r.session is not None and not meets_slos(r, tier.request_slos(self.base)):
                    self._missed[i].add(r.session)
        self._seen = len(records)
        if all(self._lost(i) for i in range(len(self.tiers))):
            return "over-saturated: every SLO tier already failed"
        return None

    def _lost(self, i: int) -> bool:
        for j, c in enumerate(self.tiers[i].criteria):
            if (
                c.series is not None and c.q is not None and self.planned
                and self._over[i][j] > (1 - c.q / 100) * self.planned + 1
            ):  # fmt: skip
                return True
            if (
                c.metric == "session_goodput" and c.op in (">=", ">") and self.planned_sessions
                and len(self._missed[i]) > (1 - c.limit) * self.planned_sessions
            ):  # fmt: skip
                return True
        return False


def bootstrap_criteria(
    tier: Tier,
    records: Sequence[RequestRecord],
    base: Mapping[str, float],
    resamples: int = 200,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Each criterion's 95% percentile-bootstrap interval at one level: resample its sessions
    (load=sessions; a session's turns stay together) or its requests with replacement,
    recompute the criterion, take the 2.5th and 97.5th percentiles. Criteria with no value on
    some resample are left out."""
    measured = [r for r in records if r.phase == "measure"]
    groups: dict[str, list[RequestRecord]] = {}
    for i, r in enumerate(measured):
        groups.setdefault(r.session if r.session is not None else f"#{i}", []).append(r)
    units = list(groups.values())
    if not units:
        return {}
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {c.text: [] for c in tier.criteria}
    for _ in range(resamples):
        sample = [r for unit in rng.choices(units, k=len(units)) for r in unit]
        metrics = tier_metrics(tier, sample, base)
        for c in tier.criteria:
            value = criterion_value(c, sample, metrics)
            if value is not None:
                draws[c.text].append(value)
    out = {}
    for text, xs in draws.items():
        low, high = percentile(xs, 2.5), percentile(xs, 97.5)
        if len(xs) == resamples and low is not None and high is not None:
            out[text] = [low, high]
    return out
