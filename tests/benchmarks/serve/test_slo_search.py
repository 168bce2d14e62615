"""SLO tiers (parsing, judging a level, over-saturation) and the capacity search's bisection."""

from __future__ import annotations

import asyncio
import math

import pytest

from metrale.benchmarks.serve.declared import METRICS
from metrale.benchmarks.serve.load import LevelSpec, LevelState
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.benchmarks.serve.search import Measured, SearchSpec, capacity_search, parse_search
from metrale.benchmarks.serve.slo import (
    OverSaturation,
    Tier,
    TierOutcome,
    bootstrap_criteria,
    evaluate,
    parse_slo,
)
from metrale.errors import UsageError


def test_tiers_and_per_request_limits_parse() -> None:
    limits, tiers = parse_slo(
        "ttft_ms=500,gold:ttft_p95<=2s,tpot_p50<=60ms,session_goodput>=95%;"
        "silver: ttft_ms_p90_turn2_4 < 5000, error_rate<=0.1",
        METRICS,
    )
    assert limits == {"ttft_ms": 500.0}
    assert [t.name for t in tiers] == ["gold", "silver"]
    gold, silver = tiers
    assert [(c.metric, c.op, c.limit) for c in gold.criteria] == [
        ("ttft_p95", "<=", 2000.0), ("tpot_p50", "<=", 60.0), ("session_goodput", ">=", 0.95),
    ]  # fmt: skip
    assert gold.criteria[0].series == "ttft" and gold.criteria[0].q == 95
    # A declared metric by name, not a percentile of a series (ttft_ms_p99 would be one).
    assert silver.criteria[0].series is None and silver.criteria[0].limit == 5000
    # Per-request limits inside a tier: the run's, tightened by its latency criteria.
    assert gold.request_slos(limits) == {"ttft_ms": 500.0, "tpot_ms": 60.0}
    assert Tier("t", parse_slo("ttft_p90<=0.3s", METRICS)[1][0].criteria).request_slos({}) == {
        "ttft_ms": 300.0
    }
    assert parse_slo("e2e_p99<=1.5s", METRICS)[1][0].name == "slo"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ttft_p95<=2s,latency_p50<=3", "declares no metric 'latency_p50'"),
        ("sesion_goodput>=0.9", "declares no metric"),
        ("ttft_p95=<2s", "is not KEY=MS"),
        ("ttft_p95<=fast", "malformed"),
        ("ttft_p101<=2s", "not within 0..100"),
        ("ttft_p95<=5%", "not %"),
        ("gold:", "has no criterion"),
        ("latency=3", "accepted keys"),
        ("ttft_ms=-1", "positive"),
        ("error_rate<=1s", "not a time"),
    ],
)
def test_bad_slo_is_one_usage_error(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle) as info:
        parse_slo(text, METRICS)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("axis", "text", "step", "needle"),
    [
        ("lanes", "8:8", None, "empty"),
        ("lanes", "9:2", None, "empty"),
        ("lanes", "0:8", None, ">= 1"),
        ("lanes", "1.5:8", None, "whole"),
        ("rate", "0:5", None, "> 0"),
        ("rate", "1:5", 10.0, "at most"),
        ("concurrency", "1-8", None, "LOW:HIGH"),
        ("concurrency", "a:b", None, "LOW:HIGH"),
    ],
)
def test_bad_search_range_is_one_usage_error(
    axis: str, text: str, step: float | None, needle: str
) -> None:
    with pytest.raises(UsageError, match=needle):
        parse_search(axis, text, step)


def record(
    i: int, ttft_s: float, session: str | None = None, error: str | None = None
) -> RequestRecord:
    return RequestRecord(
        level=0, index=i, phase="measure", intended_s=i, ready_s=i, send_s=i, end_s=i + 1,
        ttft_s=ttft_s, e2e_s=ttft_s + 0.1, output_tokens=3, session=session, error=error,
        chunk_times_s=[ttft_s, ttft_s + 0.05, ttft_s + 0.1], chunk_tokens=[1.0, 1.0, 1.0],
    )  # fmt: skip


def test_a_level_passes_a_tier_when_every_criterion_holds() -> None:
    _, (tier,) = parse_slo("ttft_p50<=100ms,session_goodput>=0.5", METRICS)
    # sessions a and b: a's turns all within 100 ms, b's second turn at 300 ms
    rs = [record(0, 0.05, "a"), record(1, 0.06, "a"), record(2, 0.07, "b"), record(3, 0.3, "b")]
    out = evaluate(tier, rs, {}, {})
    assert out.values["ttft_p50<=100ms"] == pytest.approx(65.0)
    assert out.values["session_goodput>=0.5"] == 0.5 and out.session_goodput == 0.5
    assert out.passed and out.attainment == 0.5
    _, (strict,) = parse_slo("ttft_p50<=100ms,session_goodput>=0.75", METRICS)
    assert not evaluate(strict, rs, {}, {}).passed
    # A failed request fails its session but is not in the latency percentiles.
    rs2 = [*rs[:2], record(4, 0.01, "c", error="timeout: x")]
    got = evaluate(tier, rs2, {}, {})
    assert got.values["ttft_p50<=100ms"] == pytest.approx(55.0) and got.session_goodput == 0.5
    # Without sessions, attainment is the fraction of requests meeting the tier's limits.
    plain = [record(i, t) for i, t in enumerate((0.05, 0.08, 0.2, 0.09))]
    assert evaluate(tier, plain, {}, {}).attainment == 0.75


def test_bootstrap_interval_brackets_the_criterion() -> None:
    _, (tier,) = parse_slo("ttft_p50<=100ms", METRICS)
    rs = [record(i, 0.01 * (i % 20)) for i in range(200)]
    (low, high) = bootstrap_criteria(tier, rs, {})["ttft_p50<=100ms"]
    assert low <= evaluate(tier, rs, {}, {}).values["ttft_p50<=100ms"] <= high  # type: ignore[operator]
    assert 0 < high - low < 60


def test_over_saturation_stops_only_when_every_tier_is_lost() -> None:
    _, tiers = parse_slo("a:ttft_p90<=100ms;b:ttft_p50<=100ms", METRICS)
    stop = OverSaturation(tiers, {}, planned=100, planned_sessions=None)
    state = LevelState(LevelSpec(index=0, label="x", concurrency=1))
    for i in range(11):  # 11 slow: tier a (at most 10% + 1 of 100 over) is lost, b is not
        state.measured.append(record(i, 0.5))
        assert stop(state) is None
    for i in range(11, 52):
        state.measured.append(record(i, 0.5))
        reason = stop(state)
    assert reason is not None and "over-saturated" in reason
    # Without a planned count nothing is decided early.
    unplanned = OverSaturation(tiers, {}, planned=None, planned_sessions=None)
    assert unplanned(state) is None


def fake_level(capacity: float):  # type: ignore[no-untyped-def]
    """A level whose tier passes exactly up to `capacity` (the search's contract, not timing)."""
    seen: list[float] = []

    async def measure(load: float) -> Measured:
        seen.append(load)
        outcome = TierOutcome(passed=load <= capacity, attainment=1.0 if load <= capacity else 0.0)
        return Measured(len(seen) - 1, {"t": outcome}, {"request_throughput": load})

    return measure, seen


@pytest.mark.parametrize(
    ("low", "high", "capacity"),
    [(1, 64, 37), (1, 64, 1), (1, 64, 64), (1, 64, 63), (2, 1000, 517), (1, 2, 1), (1, 2, 2)],
)
def test_bisection_finds_the_boundary_within_the_level_bound(
    low: int, high: int, capacity: int
) -> None:
    spec = parse_search("lanes", f"{low}:{high}", None)
    measure, seen = fake_level(capacity)
    result = asyncio.run(capacity_search(spec, [Tier("t")], measure, lambda t, i: {}))
    (b,) = result.tiers
    assert b.boundary == capacity
    assert b.above == (None if capacity == high else capacity + 1)
    assert result.levels == len(seen) == len(set(seen))
    assert len(seen) <= math.ceil(math.log2(high - low + 1)) + 3
    assert len(seen) <= spec.max_levels


def test_search_below_the_range_and_rates() -> None:
    spec = parse_search("lanes", "4:64", None)
    measure, seen = fake_level(2)
    (b,) = asyncio.run(capacity_search(spec, [Tier("t")], measure, lambda t, i: {})).tiers
    assert b.boundary is None and b.above == 4 and seen == [4]
    rate = parse_search("rate", "1:9", 0.5)
    assert rate == SearchSpec("rate", 1.0, 9.0, 0.5)
    measure, seen = fake_level(6.3)
    (b,) = asyncio.run(capacity_search(rate, [Tier("t")], measure, lambda t, i: {})).tiers
    assert b.boundary == 6.0 and b.above == 6.5
    assert len(seen) <= math.ceil(math.log2(16)) + 3
