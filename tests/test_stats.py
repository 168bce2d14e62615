import pytest

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


def test_spread_cell_formats_seconds_without_exponents() -> None:
    s = Spread.of([0.1, 0.2, 0.3, 0.4, 0.5])
    assert s.cell() == "0.300 (0.140–0.460)"
    tiny = Spread.of([0.0000038] * 3)
    assert "e-" not in tiny.cell()
    assert Spread.of([]).cell() == "-"


def test_bootstrap_separates_shifted_samples_and_not_identical_ones() -> None:
    a = [1.0 + 0.01 * (i % 10) for i in range(200)]
    same = bootstrap_diff(a, list(a))
    assert same.low <= 0 <= same.high
    shifted = bootstrap_diff(a, [x + 0.5 for x in a])
    assert shifted.low > 0.4
