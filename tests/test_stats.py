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
