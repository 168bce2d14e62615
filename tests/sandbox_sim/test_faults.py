"""The injected faults: seeded, and each one what its flag says."""

from __future__ import annotations

import time

import pytest

from metrale.errors import UsageError
from metrale.sandbox_sim.faults import FaultConfig, Faults, parse_latency
from metrale.stats import percentile


def test_latency_replays_the_given_p50_and_p90() -> None:
    faults = Faults(FaultConfig(create_latency=(10.9, 14.0), seed=3))
    draws = sorted(faults.creation_latency() for _ in range(20_000))
    assert percentile(draws, 50) == pytest.approx(10.9, rel=0.03)
    assert percentile(draws, 90) == pytest.approx(14.0, rel=0.03)


def test_the_same_seed_draws_the_same_latencies() -> None:
    def draws(seed: int) -> list[float]:
        faults = Faults(FaultConfig(create_latency=(1.0, 3.0), stuck=0.5, seed=seed))
        return [faults.creation_latency() + faults.stuck() for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_equal_quantiles_are_a_constant_and_none_is_zero() -> None:
    constant = Faults(FaultConfig(create_latency=(2.5, 2.5)))
    assert {constant.creation_latency() for _ in range(9)} == {2.5}
    assert Faults(FaultConfig()).creation_latency() == 0.0


@pytest.mark.parametrize("text", ["abc", "5,2", "-1,2", "1,2,3", "nan,1", "1,inf", ""])
def test_a_bad_latency_is_one_line_naming_what_is_accepted(text: str) -> None:
    with pytest.raises(UsageError, match="--create-latency"):
        parse_latency(text)


def test_latency_accepts_one_number_or_two() -> None:
    assert parse_latency("3") == (3.0, 3.0)
    assert parse_latency("10.9, 14") == (10.9, 14.0)


def test_the_rate_limit_admits_a_second_s_worth_then_refuses_then_refills() -> None:
    faults = Faults(FaultConfig(create_rate=5))
    admitted = [faults.admit_creation(0) for _ in range(8)]
    assert admitted[:5] == [None] * 5
    assert all(a is not None and "5 sandbox creations per second" in a for a in admitted[5:])
    time.sleep(0.45)  # two more tokens at 5/s
    assert [faults.admit_creation(0) for _ in range(3)].count(None) == 2
    assert faults.refused == 4


def test_a_rate_below_one_per_second_still_admits_the_first() -> None:
    faults = Faults(FaultConfig(create_rate=0.1))
    assert [faults.admit_creation(0) is None for _ in range(2)] == [True, False]


def test_the_quota_counts_live_sandboxes() -> None:
    faults = Faults(FaultConfig(quota=3))
    assert faults.admit_creation(2) is None
    assert "quota of 3" in (faults.admit_creation(3) or "")


def test_stuck_and_gateway_failures_are_the_given_fractions() -> None:
    faults = Faults(FaultConfig(stuck=0.1, gateway_fail=0.25, seed=1))
    stuck = sum(faults.stuck() for _ in range(10_000))
    failed = sum(faults.gateway_fails() for _ in range(10_000))
    assert 900 < stuck < 1100
    assert 2300 < failed < 2700
    none = Faults(FaultConfig())
    assert not any(none.stuck() or none.gateway_fails() for _ in range(1000))
