"""Budgets: `<metric>_min` / `<metric>_max` bounds, the verdict they give, and BENCH.toml.

The boundaries are the point: a bound is inclusive (`reward_min = 0.9` passes at exactly 0.9),
an absent metric fails, and the printed lines are what a user reads in CI logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.budgets import load_budgets
from metrale.errors import UsageError
from metrale.plugin import Check, Verdict, check_bounds


@pytest.mark.parametrize(
    ("value", "bound", "passed"),
    [
        (0.9, {"reward_min": 0.9}, True),  # inclusive at the limit
        (0.8999, {"reward_min": 0.9}, False),
        (0.95, {"reward_min": 0.9}, True),
        (60.0, {"reward_max": 60.0}, True),  # inclusive at the limit
        (60.001, {"reward_max": 60.0}, False),
        (-1.0, {"reward_max": 0.0}, True),
        (0, {"reward_min": 0}, True),
        (0, {"reward_max": -1}, False),
    ],
)
def test_bounds_are_inclusive_at_the_limit(
    value: float, bound: dict[str, float], passed: bool
) -> None:
    verdict = check_bounds({"reward": value}, bound)
    assert verdict.passed is passed
    [check] = verdict.checks
    assert check.metric == "reward" and check.passed is passed
    assert check.value == value and check.limit == next(iter(bound.values()))
    assert check.op == (">=" if "reward_min" in bound else "<=")


def test_every_bound_is_one_check_in_order_and_absent_metrics_fail() -> None:
    verdict = check_bounds(
        {"reward_mean": 0.5, "e2e_s": 12.0, "errors": 0, "ttft_s": None},
        {"reward_mean_min": 0.25, "e2e_s_max": 10, "errors_max": 0, "ttft_s_max": 1,
         "gone_min": 3},
    )  # fmt: skip
    assert [(c.metric, c.op, c.limit, c.value, c.passed, c.reason) for c in verdict.checks] == [
        ("reward_mean", ">=", 0.25, 0.5, True, ""),
        ("e2e_s", "<=", 10.0, 12.0, False, ""),
        ("errors", "<=", 0.0, 0.0, True, ""),
        ("ttft_s", "<=", 1.0, None, False, "absent"),
        ("gone", ">=", 3.0, None, False, "absent"),
    ]
    assert verdict.passed is False
    assert verdict.lines() == [
        "PASS reward_mean = 0.5 (must be >= 0.25)",
        "FAIL e2e_s = 12 (must be <= 10)",
        "PASS errors = 0 (must be <= 0)",
        "FAIL ttft_s = absent (must be <= 1): absent",
        "FAIL gone = absent (must be >= 3): absent",
    ]


def test_a_metric_named_like_a_suffix_is_split_at_the_last_suffix_only() -> None:
    [check] = check_bounds({"max_min": 2.0}, {"max_min_max": 3}).checks
    assert (check.metric, check.op, check.passed) == ("max_min", "<=", True)
    [check] = check_bounds({"x_max": 1.0}, {"x_max_min": 1.5}).checks
    assert (check.metric, check.op, check.passed) == ("x_max", ">=", False)


def test_verdict_passes_only_when_every_check_passes_and_none_without_checks() -> None:
    ok = Check(metric="a", op=">=", limit=1, value=2, passed=True)
    bad = Check(metric="b", op="<=", limit=1, value=2, passed=False)
    assert Verdict().passed is None
    assert Verdict(checks=[ok]).passed is True
    assert Verdict(checks=[ok, bad]).passed is False
    assert Verdict(checks=[bad, ok]).passed is False
    merged = Verdict(checks=[ok]).merged(Verdict(checks=[bad]))
    assert [c.metric for c in merged.checks] == ["a", "b"] and merged.passed is False
    assert check_bounds({"x": 1}, {}).passed is None


def test_limits_and_values_print_plainly() -> None:
    verdict = check_bounds({"a": 0.123456, "b": 1234567.0}, {"a_min": 0.5, "b_max": 2.5e6})
    assert verdict.lines() == [
        "FAIL a = 0.1235 (must be >= 0.5)",
        "PASS b = 1235000 (must be <= 2500000)",  # metrale.fmt: never an exponent
    ]


def test_a_bound_without_min_or_max_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="budget 'reward' must end in _min or _max"):
        check_bounds({"reward": 1.0}, {"reward": 1.0})
    with pytest.raises(UsageError, match="must end in _min or _max"):
        check_bounds({}, {"reward_mean_minimum": 1.0})


def test_load_budgets_reads_the_benchmarks_table_as_floats(tmp_path: Path) -> None:
    f = tmp_path / "BENCH.toml"
    f.write_text("[gsm8k]\nreward_mean_min = 0.9\ne2e_s_max = 60\n[serve]\nttft_s_max = 1\n")
    got = load_budgets(f, "gsm8k")
    assert got == {"reward_mean_min": 0.9, "e2e_s_max": 60.0}
    assert all(type(v) is float for v in got.values())
    assert load_budgets(f, "serve") == {"ttft_s_max": 1.0}
    assert load_budgets(f, "absent") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gsm8k]\nreward_min = true\n", "gsm8k.reward_min = True is not a number"),
        ('[gsm8k]\nreward_min = "0.9"\n', "gsm8k.reward_min = '0.9' is not a number"),
        ("gsm8k = 3\n", "[gsm8k] must be a table"),
        ("[gsm8k]\nreward = 0.9\n", "budget 'reward' must end in _min or _max"),
        ("[gsm8k\n", "is not valid TOML"),
    ],
)
def test_bad_budgets_files_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "BENCH.toml"
    f.write_text(text)
    with pytest.raises(UsageError) as info:
        load_budgets(f, "gsm8k")
    assert message in str(info.value)
    assert str(f) in str(info.value) or "budget 'reward'" in str(info.value)


def test_a_missing_budgets_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_budgets(tmp_path / "nope.toml", "gsm8k")


def test_budget_metrics_must_be_declared_by_the_benchmark() -> None:
    from metrale.budgets import check_budget_metrics
    from metrale.plugin import Metric

    metrics = [
        Metric("reward_mean", "1", "higher", "mean reward"),
        Metric("e2e_p50", "s", "lower", "median end to end"),
    ]
    # Names with underscores: only the last `_min` / `_max` is the suffix.
    check_budget_metrics({"reward_mean_min": 0.5, "e2e_p50_max": 2.0}, metrics, "gsm8k")
    check_budget_metrics({}, metrics, "gsm8k")
    with pytest.raises(UsageError) as info:
        check_budget_metrics({"reward_mean_min": 0.5, "ttft_p50_max": 1.0}, metrics, "gsm8k")
    assert str(info.value) == (
        "budget 'ttft_p50_max': gsm8k declares no metric 'ttft_p50'; accepted: reward_mean, e2e_p50"
    )
