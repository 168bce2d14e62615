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


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0, "0"),
        (123.456, "123"),
        (100.0, "100"),
        (99.99, "100.0"),
        (10.0, "10.0"),
        (12.345, "12.3"),
        (9.9994, "9.999"),
        (1.5, "1.500"),
        (0.001, "0.001"),
        (0.00099, "0.00099"),
        (0.0000038, "0.0000038"),
        (0.000012345, "0.000012"),
        (-0.5, "-0.500"),
        (-150.0, "-150"),
        (-0.00002, "-0.000020"),
    ],
)
def test_cell_numbers_are_plain_decimals(x: float, text: str) -> None:
    assert Spread(n=1, p10=x, p50=x, p90=x).cell() == f"{text} ({text}–{text})"


def test_cell_digits_set_the_places_between_1_ms_and_10_s() -> None:
    s = Spread(n=3, p10=0.5, p50=1.25, p90=2.0)
    assert s.cell(digits=1) == "1.2 (0.5–2.0)"
    assert s.cell(digits=4) == "1.2500 (0.5000–2.0000)"


def test_bootstrap_point_estimate_interval_and_determinism() -> None:
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    b = [3.0, 4.0, 5.0, 6.0, 7.0]
    iv = bootstrap_diff(a, b)
    assert iv.estimate == 2.0 and iv.level == 0.95
    assert -3.0 <= iv.low <= 2.0 <= iv.high <= 6.0
    assert iv.low < 2.0 < iv.high
    assert bootstrap_diff(a, b) == iv  # the fixed seed makes it reproducible

    def avg(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    assert bootstrap_diff(a, b, avg, resamples=200, seed=1) != bootstrap_diff(
        a, b, avg, resamples=200, seed=0
    )
    means = bootstrap_diff(a, b, lambda xs: sum(xs) / len(xs), resamples=500, level=0.5)
    assert means.estimate == 2.0 and means.level == 0.5
    assert 1.0 < means.low < 2.0 < means.high < 3.0
    wide = bootstrap_diff(a, b, lambda xs: sum(xs) / len(xs), resamples=500, level=0.99)
    assert wide.low < means.low and wide.high > means.high
    constant = bootstrap_diff([1.0] * 4, [3.0] * 7, resamples=50)
    assert (constant.estimate, constant.low, constant.high) == (2.0, 2.0, 2.0)


def test_bootstrap_resamples_each_side_at_its_own_size() -> None:
    sizes: list[int] = []

    def stat(xs: list[float]) -> float:
        sizes.append(len(xs))
        return float(len(xs))

    iv = bootstrap_diff([0.0] * 3, [0.0] * 8, stat, resamples=20)
    assert (iv.estimate, iv.low, iv.high) == (5.0, 5.0, 5.0)
    assert sizes == [8, 3] * 21  # stat(b) then stat(a), for the point and each resample


def test_bootstrap_needs_two_samples_and_a_statistic() -> None:
    with pytest.raises(ValueError, match="two non-empty samples"):
        bootstrap_diff([], [1.0])
    with pytest.raises(ValueError, match="two non-empty samples"):
        bootstrap_diff([1.0], [])
    with pytest.raises(ValueError, match="statistic of an empty sample"):
        bootstrap_diff([1.0], [2.0], lambda xs: None)


def test_bootstrap_interval_is_the_exact_percentiles_of_the_resampled_differences() -> None:
    """A statistic that returns 0 for A and 1, 2, ..., R for B's resamples makes the
    differences exactly 1..R, so the interval is known: p5 and p95 of 1..101 are 6 and 96."""
    calls = iter(range(10_000))

    def stat(xs: list[float]) -> float:
        return float(next(calls)) if len(xs) == 8 else 0.0

    iv = bootstrap_diff([0.0] * 3, [0.0] * 8, stat, resamples=101, level=0.9)
    assert (iv.estimate, iv.level) == (0.0, 0.9)
    assert iv.low == pytest.approx(6.0, abs=1e-9) and iv.high == pytest.approx(96.0, abs=1e-9)


def test_bootstrap_defaults_are_the_p50_2000_resamples_and_seed_0() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 10.0, 20.0, 20.0]
    assert bootstrap_diff(a, b).estimate == 7.0  # p50: 10 − 3 (p51 would give 7.36)

    def avg(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    explicit = bootstrap_diff(a, b, avg, resamples=2000, level=0.95, seed=0)
    assert bootstrap_diff(a, b, avg) == explicit
