"""compare: bootstrap intervals per metric and a same / better / worse verdict per row."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.matrix.cellfile import CellResult, write_cell
from metrale.matrix.compare import (
    DURATION_ABS_TOL_S,
    Comparison,
    Row,
    abs_tol,
    compare_cells,
    compare_paths,
    metrics_of,
    render_comparison,
)
from metrale.matrix.compare import verdict as row_verdict
from metrale.plugin import Metric
from tests.matrix.helpers import make_cell

#: The metrics the synthetic cells have samples of (stages, reward, error rate).
CORE = ("setup", "generation", "scoring", "total", "error_rate", "reward_mean")


def verdicts(rows) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.metric: r.verdict for r in rows}


def test_two_samples_of_one_distribution_are_the_same() -> None:
    a, b = make_cell(seed=1), make_cell(seed=2)
    rows = compare_cells(a, b, names=CORE)
    assert [r.metric for r in rows] == list(CORE)
    assert set(verdicts(rows).values()) == {"same"}
    for r in rows:
        assert r.low is not None and r.high is not None and r.low <= r.diff <= r.high  # type: ignore[operator]


def test_a_clearly_slower_cell_is_worse_and_a_faster_one_better() -> None:
    a = make_cell(seed=1)
    slow = compare_cells(a, make_cell(seed=2, scale=1.5))
    assert verdicts(slow)["generation"] == "worse" and verdicts(slow)["total"] == "worse"
    assert slow[1].diff is not None and slow[1].diff > 0.1
    fast = compare_cells(a, make_cell(seed=2, scale=0.6))
    assert verdicts(fast)["generation"] == "better"


def test_reward_higher_is_better_and_errors_lower_is_better() -> None:
    rows = compare_cells(make_cell(seed=1, reward_p=0.2), make_cell(seed=2, reward_p=0.8))
    assert verdicts(rows)["reward_mean"] == "better"
    rows = compare_cells(make_cell(seed=1), make_cell(seed=1, errors=40))
    assert verdicts(rows)["error_rate"] == "worse" and verdicts(rows)["errors"] == "worse"


def test_differences_below_the_tolerance_are_the_same() -> None:
    a = make_cell(seed=1, rollouts=400)
    b = make_cell(seed=1, rollouts=400, scale=1.06)  # 6% slower: a real but small difference
    assert verdicts(compare_cells(a, b, rel_tol=0.10))["generation"] == "same"
    assert verdicts(compare_cells(a, b, rel_tol=0.0))["generation"] == "worse"


def test_directories_are_matched_by_cell_name(tmp_path: Path) -> None:
    for d, scale in (("a", 1.0), ("b", 2.0)):
        write_cell(tmp_path / d, make_cell("none-r64", seed=len(d), scale=scale))
    write_cell(tmp_path / "a", make_cell("none-r64-c2", max_concurrent=2))
    result = compare_paths(tmp_path / "a", tmp_path / "b", resamples=200)
    assert {r.cell for r in result.rows} == {"none-r64"}
    assert result.worse
    assert result.unmatched == [f"none-r64-c2 (only in {tmp_path / 'a'})"]
    text = render_comparison(result)
    assert "worse" in text and "unmatched: none-r64-c2" in text
    one = compare_paths(tmp_path / "a" / "none-r64.json", tmp_path / "b" / "none-r64.json")
    assert one.worse


def test_mixed_or_missing_inputs_are_usage_errors(tmp_path: Path) -> None:
    write_cell(tmp_path / "a", make_cell())
    with pytest.raises(UsageError, match="differ in kind"):
        compare_paths(tmp_path / "a", tmp_path / "a" / "none-r64.json")
    with pytest.raises(UsageError, match="does not exist"):
        compare_paths(tmp_path / "nope", tmp_path / "a")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError, match="not a metrale cell file"):
        compare_paths(tmp_path / "bad.json", tmp_path / "bad.json")


# --------------------------------------------------------------------------- verdict boundaries

LOWER = Metric("generation", "s", "lower", "", stat="p50", value=lambda r: None)
HIGHER = Metric("reward_mean", "reward", "higher", "", stat="mean", value=lambda r: None)


@pytest.mark.parametrize(
    ("estimate", "low", "high", "a", "metric", "rel_tol", "expected"),
    [
        # |B−A| equal to the relative tolerance (25% of 2.0 = 0.5) is the same: inclusive.
        (0.5, 0.4, 0.6, 2.0, LOWER, 0.25, "same"),
        (0.5001, 0.4, 0.6, 2.0, LOWER, 0.25, "worse"),
        (-0.5, -0.6, -0.4, 2.0, LOWER, 0.25, "same"),
        (-0.6, -0.7, -0.5, 2.0, LOWER, 0.25, "better"),
        # the tolerance scales with |A|: a negative A is no smaller a tolerance
        (0.5, 0.4, 0.6, -2.0, LOWER, 0.25, "same"),
        # below the absolute floor (1 ms for durations) nothing differs; at it, still the same
        (0.001, 0.0005, 0.0015, 1.0, LOWER, 0.0, "same"),
        (0.0011, 0.0005, 0.0015, 1.0, LOWER, 0.0, "worse"),
        (0.0011, 0.0005, 0.0015, 0.0, HIGHER, 0.0, "better"),
        # an interval that touches 0 contains it
        (0.5, 0.0, 1.0, 1.0, LOWER, 0.0, "same"),
        (-0.5, -1.0, 0.0, 1.0, LOWER, 0.0, "same"),
        (0.5, 1e-9, 1.0, 1.0, LOWER, 0.0, "worse"),
        (-0.5, -1.0, -1e-9, 1.0, LOWER, 0.0, "better"),
        # direction: higher reward is better, more time is worse
        (0.3, 0.2, 0.4, 0.5, HIGHER, 0.05, "better"),
        (-0.3, -0.4, -0.2, 0.5, HIGHER, 0.05, "worse"),
        (0.3, 0.2, 0.4, 0.5, LOWER, 0.05, "worse"),
        (-0.3, -0.4, -0.2, 0.5, LOWER, 0.05, "better"),
    ],
)
def test_verdict_boundaries(
    estimate: float, low: float, high: float, a: float, metric: Metric, rel_tol: float,
    expected: str,
) -> None:  # fmt: skip
    assert row_verdict(estimate, low, high, a, metric, rel_tol) == expected


def test_the_metrics_their_directions_and_floors() -> None:
    declared = {m.name: m for m in metrics_of(make_cell())}
    assert [(n, declared[n].better, abs_tol(declared[n])) for n in CORE] == [
        ("setup", "lower", 0.001), ("generation", "lower", 0.001), ("scoring", "lower", 0.001),
        ("total", "lower", 0.001), ("error_rate", "lower", 0.0), ("reward_mean", "higher", 0.0),
    ]  # fmt: skip
    assert DURATION_ABS_TOL_S == 0.001
    # serve's metrics in milliseconds get the same 1 ms floor
    tpot = Metric("tpot_ms", "ms", "lower", "time per output token", stat="p50")
    assert abs_tol(tpot) == 1.0
    assert declared["ttft_s"].stat == "p50" and declared["accuracy"].better == "higher"


def literal_cell(name: str, gen: list[float], rewards: list[float], errors: int) -> CellResult:
    return CellResult(
        cell=name, benchmark="gsm8k", runtime="none", rollouts=len(gen), records=len(gen),
        errors=errors, rewards=rewards,
        durations={"setup": [], "generation": gen, "scoring": [], "total": gen},
    )  # fmt: skip


def test_rows_carry_the_literal_statistics_of_each_side() -> None:
    a = literal_cell("x", [1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 1.0, 1.0, 1.0], errors=1)
    b = literal_cell("x", [2.0, 3.0, 4.0, 5.0, 6.0], [0.0, 0.0, 1.0, 1.0], errors=0)
    rows = {r.metric: r for r in compare_cells(a, b, resamples=200, names=CORE)}
    assert (rows["setup"].verdict, rows["setup"].a, rows["setup"].diff) == ("n/a", None, None)
    assert rows["scoring"].verdict == "n/a"
    gen = rows["generation"]
    assert (gen.cell, gen.a, gen.b, gen.diff) == ("x", 3.0, 4.0, 1.0)
    assert gen.low is not None and gen.high is not None and gen.low <= 1.0 <= gen.high
    assert rows["total"].diff == 1.0
    # error rate: 1 failed of 5 finished, then 0 of 5
    er, rw = rows["error_rate"], rows["reward_mean"]
    assert (er.a, er.b, er.diff) == (0.2, 0.0, -0.2)
    assert (rw.a, rw.b, rw.diff) == (0.75, 0.5, -0.25)
    named = compare_cells(a, literal_cell("y", [1.0], [1.0], 0), resamples=50, names=CORE)
    assert {r.cell for r in named} == {"x vs y"}


def test_a_comparison_is_worse_when_any_row_is_and_renders_each_row() -> None:
    def row(metric: str, v: str, a: float = 0.5, diff: float = 0.25) -> Row:
        return Row("c", metric, a, a + diff, diff, diff - 0.1, diff + 0.1, v)  # type: ignore[arg-type]

    same = Comparison([row("generation", "same"), row("reward_mean", "better")], [])
    assert not same.worse
    worse = Comparison([row("generation", "same"), row("error_rate", "worse")], ["d (only in B)"])
    assert worse.worse
    text = render_comparison(worse)
    lines = [[x for x in line.split("  ") if x.strip()] for line in text.splitlines()[1:3]]
    assert [x.strip() for x in lines[0]] == [
        "c", "generation", "500 ms", "750 ms", "+250 ms", "[+150 ms, +350 ms]", "same"
    ]  # fmt: skip
    assert [x.strip() for x in lines[1]] == [
        "c", "error_rate", "0.5", "0.75", "+0.25", "[+0.15, +0.35]", "worse"
    ]  # fmt: skip
    flat = render_comparison(Comparison([row("total", "same", a=1.0, diff=0.0)], []))
    assert " +0 " not in flat and "1 s" in flat
    assert text.splitlines()[-2:] == [
        "2 rows: 1 same, 0 better, 1 worse, 0 changed",
        "unmatched: d (only in B)",
    ]
    csv_text = render_comparison(worse, "csv")
    assert csv_text.splitlines()[0] == "cell,metric,a,b,diff,low,high,verdict"
    assert csv_text.splitlines()[1] == "c,generation,0.5,0.75,0.25,0.15,0.35,same"


def test_unmatched_cells_list_a_side_first_and_do_not_stop_the_matching(tmp_path: Path) -> None:
    write_cell(tmp_path / "a", make_cell("aaa-r1", runtime="aaa", rollouts=8))  # sorts first
    for side in ("a", "b"):
        write_cell(tmp_path / side, make_cell("none-r64", seed=len(side)))
    write_cell(tmp_path / "b", make_cell("zzz-r1", runtime="zzz", rollouts=8))
    write_cell(tmp_path / "b", make_cell("zzz-r2", runtime="zzz", rollouts=9))
    result = compare_paths(tmp_path / "a", tmp_path / "b", resamples=100)
    assert {r.cell for r in result.rows} == {"none-r64"}
    assert len(result.rows) == len(metrics_of(make_cell()))
    b = tmp_path / "b"
    assert result.unmatched == [f"aaa-r1 (only in {tmp_path / 'a'})", f"zzz-r1 (only in {b})",
                                f"zzz-r2 (only in {b})"]  # fmt: skip


def test_the_default_tolerance_is_5_percent() -> None:
    a = make_cell(seed=1, rollouts=400)
    near = compare_cells(a, make_cell(seed=1, rollouts=400, scale=1.04), resamples=300)
    assert verdicts(near)["generation"] == "same"
    far = compare_cells(a, make_cell(seed=1, rollouts=400, scale=1.07), resamples=300)
    assert verdicts(far)["generation"] == "worse"


def test_a_whole_run_value_row_has_its_difference_and_no_verdict() -> None:
    a, b = make_cell(seed=1), make_cell(seed=1)
    a.e2e_s, b.e2e_s = 10.0, 12.5
    [row] = compare_cells(a, b, names=("e2e_s",))
    assert (row.a, row.b, row.diff, row.low, row.high, row.verdict) == (
        10.0, 12.5, 2.5, None, None, "n/a"
    )  # fmt: skip
    b.e2e_s = None
    [row] = compare_cells(a, b, names=("e2e_s",))
    assert (row.a, row.b, row.diff, row.verdict) == (10.0, None, None, "n/a")


def test_defaults_2000_resamples_and_5_percent_from_files_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metrale.matrix import compare

    real = compare.bootstrap_diff
    used: list[int] = []

    def spy(*args, resamples: int, **kw):  # type: ignore[no-untyped-def]
        used.append(resamples)
        return real(*args, resamples=min(resamples, 200), **kw)

    monkeypatch.setattr(compare, "bootstrap_diff", spy)
    base = make_cell(seed=1, rollouts=2000)
    compare_cells(base, make_cell(seed=2), names=("generation",))
    assert used == [2000]
    write_cell(tmp_path / "a", base)
    # B is A's every duration x 1.045: the interval excludes 0, the 4.5% is within 5%
    write_cell(tmp_path / "b", make_cell(seed=1, rollouts=2000, scale=1.045))
    [a] = list((tmp_path / "a").glob("*.json"))
    [b] = list((tmp_path / "b").glob("*.json"))
    near = compare_paths(a, b, names=("generation",))
    assert used == [2000, 2000] and verdicts(near.rows) == {"generation": "same"}
    [row] = near.rows
    assert row.low is not None and row.low > 0


def test_two_sweep_directories_of_one_cell_each_compare(tmp_path: Path) -> None:
    write_cell(tmp_path / "a", make_cell("none-r64", seed=1))
    write_cell(tmp_path / "b", make_cell("none-r64", seed=2))
    result = compare_paths(tmp_path / "a", tmp_path / "b", resamples=50, names=("total",))
    assert [(r.cell, r.metric) for r in result.rows] == [("none-r64", "total")]
    assert result.unmatched == [] and "total" in {m.name for m in result.metrics}


def test_a_ratio_with_no_denominator_on_one_side_is_na() -> None:
    from metrale.matrix.compare import _row

    rate = Metric("tok_s", "tok/s", "higher", "tokens per second", stat="ratio",
                  value=lambda r: 1.0, per=lambda r: 1.0)  # fmt: skip
    a, b = make_cell(seed=1), make_cell(seed=2)
    a.samples["tok_s"] = [[5.0, 0.0], [3.0, 0.0]]  # no time measured: no rate
    b.samples["tok_s"] = [[5.0, 1.0], [3.0, 1.0]]
    row = _row("c", rate, a, b, 0.05, 50)
    assert (row.a, row.b, row.diff, row.verdict) == (None, 4.0, None, "n/a")


def test_compare_cells_defaults_to_5_percent() -> None:
    base = make_cell(seed=1, rollouts=2000)
    scaled = make_cell(seed=1, rollouts=2000, scale=1.045)  # every duration x 1.045
    assert verdicts(compare_cells(base, scaled, names=("generation",), resamples=200)) == {
        "generation": "same"
    }
    assert verdicts(
        compare_cells(base, scaled, names=("generation",), resamples=200, rel_tol=0.04)
    ) == {"generation": "worse"}


COUNT = Metric("turns", "turns", None, "", stat="mean", value=lambda r: None)


@pytest.mark.parametrize(
    ("estimate", "low", "high", "expected"),
    [(0.5, 0.4, 0.6, "changed"), (-0.5, -0.6, -0.4, "changed"), (0.5, -0.1, 0.6, "same"),
     (0.04, 0.01, 0.06, "same")],
)  # fmt: skip
def test_a_metric_without_a_direction_is_changed_never_better_or_worse(
    estimate: float, low: float, high: float, expected: str
) -> None:
    """More turns is neither better nor worse: outside the tolerance it is `changed`."""
    assert row_verdict(estimate, low, high, 1.0, COUNT, 0.05) == expected


def test_cells_of_two_benchmarks_do_not_compare() -> None:
    a, b = make_cell("none-r64"), make_cell("none-r64")
    b.benchmark = "serve"
    with pytest.raises(UsageError, match="a gsm8k cell and a serve cell do not compare"):
        compare_cells(a, b)


def test_a_declared_whole_run_value_is_read_from_the_cells_metrics() -> None:
    from metrale.matrix.compare import _row

    rate = Metric("req_per_s", "req/s", "higher", "", stat="value")
    a, b = make_cell(seed=1), make_cell(seed=2)
    a.metrics["req_per_s"], b.metrics["req_per_s"] = 40.0, 50.0
    row = _row("c", rate, a, b, 0.05, 50)
    assert (row.a, row.b, row.diff, row.low, row.verdict) == (40.0, 50.0, 10.0, None, "n/a")


def test_two_sweeps_without_a_common_cell_are_a_usage_error(tmp_path: Path) -> None:
    write_cell(tmp_path / "a", make_cell("none-r64"))
    write_cell(tmp_path / "b", make_cell("none-r32", rollouts=32))
    with pytest.raises(UsageError, match="have no cell name in common"):
        compare_paths(tmp_path / "a", tmp_path / "b", resamples=20)


def test_a_ratio_whose_resamples_can_lack_a_denominator_has_no_interval() -> None:
    """Both sides have a rate, but a resample may draw only rollouts that measured no time:
    the row keeps both rates and their difference, with no interval and no verdict."""
    from metrale.matrix.compare import _row

    rate = Metric("tok_s", "tok/s", "higher", "tokens per second", stat="ratio",
                  value=lambda r: 1.0, per=lambda r: 1.0)  # fmt: skip
    a, b = make_cell(seed=1), make_cell(seed=2)
    a.samples["tok_s"] = [[4.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    b.samples["tok_s"] = [[6.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    row = _row("c", rate, a, b, 0.05, 200)
    assert (row.a, row.b, row.diff, row.low, row.high, row.verdict) == (
        4.0, 6.0, 2.0, None, None, "n/a"
    )  # fmt: skip
