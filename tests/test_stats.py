from collections.abc import Sequence

import pytest

from metrale import stats
from metrale.stats import Spread, bootstrap_diff, percentile


def test_percentile_linear_interpolation() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 10) == pytest.approx(1.3)
    assert percentile([5.0], 90) == 5.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_spread_cell_is_p50_p10_p90_in_one_unit() -> None:
    s = Spread.of([0.1, 0.2, 0.3, 0.4, 0.5])
    assert s.cell() == "300 (140–460)"  # ms: the unit its p50 reads best in
    assert s.cell("s") == "0.3 (0.14–0.46)"
    tiny = Spread.of([0.0000038] * 3)
    assert tiny.cell() == "3.8 (3.8–3.8)"
    assert Spread.of([]).cell() == "-"


def test_bootstrap_separates_shifted_samples_and_not_identical_ones() -> None:
    a = [1.0 + 0.01 * (i % 10) for i in range(200)]
    same = bootstrap_diff(a, list(a))
    assert same.low <= 0 <= same.high
    shifted = bootstrap_diff(a, [x + 0.5 for x in a])
    assert shifted.low > 0.4


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([10.0, 20.0, 30.0, 40.0, 50.0], 25, 20.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 30, 22.0),  # h = 1.2: 20 + 0.2 * 10
        ([50.0, 10.0, 40.0, 20.0, 30.0], 90, 46.0),  # unsorted input, h = 3.6
        ([1.0, 3.0], 50, 2.0),
        ([1.0, 3.0], 75, 2.5),
        ([2.0, 2.0, 8.0], 100, 8.0),
        ([2.0, 2.0, 8.0], 0, 2.0),
        ([-4.0, -1.0], 50, -2.5),
    ],
)
def test_percentile_literal_values(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected, abs=1e-12)


def test_percentile_rejects_q_outside_0_to_100_and_accepts_the_ends() -> None:
    for bad in (-0.001, 100.001, -50):
        with pytest.raises(ValueError, match="within 0..100"):
            percentile([1.0], bad)
    assert percentile([1.0, 2.0], 0.0) == 1.0 and percentile([1.0, 2.0], 100.0) == 2.0


def test_mean_and_spread_of_literal_samples() -> None:
    from metrale.stats import mean

    assert mean([1.0, 2.0, 6.0]) == 3.0 and mean([]) is None
    s = Spread.of([5.0, 1.0, 4.0, 2.0, 3.0])
    assert s.model_dump() == {"n": 5, "p10": 1.4, "p50": 3.0, "p90": 4.6, "mean": 3.0,
                              "min": 1.0, "max": 5.0}  # fmt: skip
    assert Spread.of([]).model_dump() == {"n": 0, "p10": None, "p50": None, "p90": None,
                                          "mean": None, "min": None, "max": None}  # fmt: skip
    assert Spread(n=1, p50=1.0).cell() == "-"
    assert Spread(n=1, p50=1.0, p10=1.0).cell() == "-"
    assert Spread(n=1, p50=1.0, p90=1.0).cell() == "-"


def test_cell_digits_are_significant_figures() -> None:
    s = Spread(n=3, p10=0.5, p50=1.25, p90=2.0)
    assert s.cell("s", digits=2) == "1.2 (0.5–2)"
    assert s.cell("s", digits=4) == "1.25 (0.5–2)"
    assert s.cell("ms", digits=3) == "1250 (500–2000)"


def test_cell_defaults_to_three_significant_figures() -> None:
    assert Spread(n=3, p10=0.5, p50=1.2345, p90=2.0).cell("s") == "1.23 (0.5–2)"


class _Ranked:
    """A statistic whose resampled differences are known in advance: 0 for every resample of
    `a` (all 0.0) and 0, 1, 2, ... for the successive samples of `b` (all 1.0). With 2,000
    resamples the differences are exactly 1..2000, whatever the random draws."""

    def __init__(self) -> None:
        self.calls = 0
        self.b_calls = 0

    def __call__(self, xs: list[float]) -> float:
        self.calls += 1
        if xs[0] == 0.0:
            return 0.0
        self.b_calls += 1
        return float(self.b_calls - 1)


def test_bootstrap_interval_is_the_percentiles_of_2000_resampled_differences() -> None:
    stat = _Ranked()
    iv = bootstrap_diff([0.0], [1.0], stat)
    # One point estimate (stat(b) = 0) and 2,000 resamples, each of a and of b.
    assert stat.calls == 4002
    assert iv.estimate == 0.0 and iv.level == 0.95
    # Differences 1..2000; 95%: the 2.5th and 97.5th percentiles, type 7 (h = 1999 q / 100):
    # h = 49.975 -> 50.975 and h = 1949.025 -> 1950.025.
    assert iv.low == pytest.approx(50.975, abs=1e-9)
    assert iv.high == pytest.approx(1950.025, abs=1e-9)
    narrow = bootstrap_diff([0.0], [1.0], _Ranked(), resamples=100, level=0.5)
    # Differences 1..100; 25th and 75th percentiles: h = 24.75 -> 25.75, h = 74.25 -> 75.25.
    assert (narrow.low, narrow.high, narrow.level) == (25.75, 75.25, 0.5)


def test_bootstrap_default_statistic_is_the_median_difference_b_minus_a() -> None:
    iv = bootstrap_diff([1.0, 2.0, 3.0], [0.0, 10.0, 20.0], resamples=10)
    assert iv.estimate == 8.0  # p50(b) - p50(a) = 10 - 2


def test_bootstrap_refuses_either_empty_sample() -> None:
    for a, b in (([], [1.0]), ([1.0], []), ([], [])):
        with pytest.raises(ValueError, match="two non-empty samples"):
            bootstrap_diff(a, b)


def test_bootstrap_refuses_a_statistic_without_a_value() -> None:
    """None from the statistic (a ratio with no denominator) is an error, on the samples
    themselves or on any one resample, never a difference computed from None."""
    with pytest.raises(ValueError, match="no value on a sample"):
        bootstrap_diff([1.0, 2.0], [3.0, 4.0], lambda xs: None)

    def spread(xs: Sequence[float]) -> float | None:
        return None if len(set(xs)) == 1 else max(xs) - min(xs)

    assert spread([1.0, 2.0]) == 1.0  # both samples have a value; a resample [1, 1] has none
    with pytest.raises(ValueError, match="no value on a sample or one of its resamples"):
        bootstrap_diff([1.0, 2.0], [3.0, 5.0], spread, resamples=50)


def test_an_interval_is_95_percent_unless_it_says_otherwise() -> None:
    from metrale.stats import Interval

    assert Interval(estimate=1.0, low=0.0, high=2.0).level == 0.95


def test_a_sample_with_repeated_values_counts_every_value() -> None:
    """Rewards and error flags are 0/1 samples: every value counts, not every distinct one."""
    flags = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert stats.mean(flags) == 0.75
    spread = stats.Spread.of(flags)
    assert (spread.n, spread.mean, spread.min, spread.max) == (8, 0.75, 0.0, 1.0)
    assert stats.percentile([2.0, 2.0, 2.0, 2.0, 7.0], 50) == 2.0
