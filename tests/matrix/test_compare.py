"""compare: bootstrap intervals per metric and a same / better / worse verdict per row."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.matrix.cellfile import write_cell
from metrale.matrix.compare import compare_cells, compare_paths, render_comparison
from tests.matrix.helpers import make_cell


def verdicts(rows) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.metric: r.verdict for r in rows}


def test_two_samples_of_one_distribution_are_the_same() -> None:
    a, b = make_cell(seed=1), make_cell(seed=2)
    rows = compare_cells(a, b)
    assert [r.metric for r in rows] == [
        "setup", "generation", "scoring", "total", "errors", "reward"
    ]  # fmt: skip
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
    assert verdicts(rows)["reward"] == "better"
    rows = compare_cells(make_cell(seed=1), make_cell(seed=1, errors=40))
    assert verdicts(rows)["errors"] == "worse"


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
