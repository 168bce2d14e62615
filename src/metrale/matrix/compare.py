"""Tell a real difference between two sets of results from noise: A vs B, metric by metric.

Each row compares one metric of two cells (B − A) with a percentile-bootstrap 95% interval
(`metrale.stats.bootstrap_diff`, 2,000 resamples, fixed seed so that the same inputs always give
the same output). The metrics and their statistic:

- `setup`, `generation`, `scoring`, `total`: the p50 of the per-rollout durations, seconds;
  lower is better.
- `errors`: the error rate, failed rollouts / finished rollouts; lower is better.
- `reward`: the mean reward over rollouts that have one; higher is better.

Verdict rule, per row: **same** when the interval contains 0, or when the difference is smaller
than the tolerance: `max(rel_tol × |A|, abs_tol)` (defaults 5% and, for durations, 1 ms: below
that, scheduling jitter on a shared machine dominates). Otherwise **better** or **worse** by the
sign of the difference and the metric's direction. `n/a` when a side has no sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale.errors import UsageError
from metrale.matrix.cellfile import (
    CellResult,
    cell_from_run_dir,
    is_run_dir,
    read_cell,
    read_cells,
)
from metrale.matrix.report import seconds_text
from metrale.rollout import SUMMARY_STAGES
from metrale.stats import bootstrap_diff, mean, percentile
from metrale.table import render

Verdict = Literal["same", "better", "worse", "n/a"]
#: Durations below this differ by scheduling jitter, not by the system under test (seconds).
DURATION_ABS_TOL_S = 0.001


@dataclass(frozen=True)
class Metric:
    name: str
    sample: Callable[[CellResult], list[float]]
    stat: Callable[[Sequence[float]], float | None]
    lower_is_better: bool
    abs_tol: float = 0.0


def _p50(xs: Sequence[float]) -> float | None:
    return percentile(xs, 50)


def _stage_metric(stage: str) -> Metric:
    return Metric(stage, lambda c: c.stage(stage), _p50, True, DURATION_ABS_TOL_S)


METRICS: tuple[Metric, ...] = (
    *(_stage_metric(s) for s in SUMMARY_STAGES),
    Metric("errors", CellResult.error_flags, mean, True),
    Metric("reward", lambda c: list(c.rewards), mean, False),
)


@dataclass(frozen=True)
class Row:
    cell: str
    metric: str
    a: float | None
    b: float | None
    diff: float | None
    low: float | None
    high: float | None
    verdict: Verdict


def verdict(
    estimate: float, low: float, high: float, a: float, metric: Metric, rel_tol: float
) -> Verdict:
    """The rule in the module docstring: same / better / worse for one row."""
    tolerance = max(rel_tol * abs(a), metric.abs_tol)
    if low <= 0 <= high or abs(estimate) <= tolerance:
        return "same"
    worse = estimate > 0 if metric.lower_is_better else estimate < 0
    return "worse" if worse else "better"


def compare_cells(
    a: CellResult, b: CellResult, *, rel_tol: float = 0.05, resamples: int = 2000
) -> list[Row]:
    label = a.cell if a.cell == b.cell else f"{a.cell} vs {b.cell}"
    rows = []
    for m in METRICS:
        xa, xb = m.sample(a), m.sample(b)
        sa, sb = m.stat(xa), m.stat(xb)
        if not xa or not xb or sa is None or sb is None:
            rows.append(Row(label, m.name, sa, sb, None, None, None, "n/a"))
            continue
        iv = bootstrap_diff(xa, xb, m.stat, resamples=resamples)
        v = verdict(iv.estimate, iv.low, iv.high, sa, m, rel_tol)
        rows.append(Row(label, m.name, sa, sb, iv.estimate, iv.low, iv.high, v))
    return rows


def load_side(path: Path) -> CellResult | list[CellResult]:
    """A cell file, a run directory (one cell), or a directory of cell files (many)."""
    if path.is_file():
        return read_cell(path)
    if path.is_dir():
        return cell_from_run_dir(path) if is_run_dir(path) else read_cells(path)
    raise UsageError(
        f"{path} does not exist; give a cell file, a sweep directory or a run directory"
    )


@dataclass
class Comparison:
    rows: list[Row]
    unmatched: list[str]

    @property
    def worse(self) -> bool:
        return any(r.verdict == "worse" for r in self.rows)


def compare_paths(a: Path, b: Path, *, rel_tol: float = 0.05, resamples: int = 2000) -> Comparison:
    """Compare two inputs; two sweep directories are matched cell by cell, by name."""
    side_a, side_b = load_side(a), load_side(b)
    if isinstance(side_a, CellResult) and isinstance(side_b, CellResult):
        return Comparison(compare_cells(side_a, side_b, rel_tol=rel_tol, resamples=resamples), [])
    if isinstance(side_a, CellResult) or isinstance(side_b, CellResult):
        raise UsageError(
            "compare a cell with a cell and a sweep directory with a sweep directory "
            f"({a} and {b} differ in kind)"
        )
    by_name = {c.cell: c for c in side_b}
    rows: list[Row] = []
    unmatched = [
        f"{c.cell} (only in {b})" for c in side_b if c.cell not in {x.cell for x in side_a}
    ]
    for cell in side_a:
        other = by_name.get(cell.cell)
        if other is None:
            unmatched.insert(0, f"{cell.cell} (only in {a})")
            continue
        rows += compare_cells(cell, other, rel_tol=rel_tol, resamples=resamples)
    if not rows:
        raise UsageError(f"{a} and {b} have no cell name in common")
    return Comparison(rows, unmatched)


COLUMNS = ("cell", "metric", "A", "B", "B−A", "95% interval", "verdict")


def render_comparison(result: Comparison, style: str = "plain") -> str:
    """A table row per metric; durations in readable units, error rate and reward as is.
    CSV carries raw numbers (durations in seconds) and the interval as two columns."""
    if style == "csv":
        raw = [[r.cell, r.metric, r.a, r.b, r.diff, r.low, r.high, r.verdict] for r in result.rows]
        columns = ("cell", "metric", "a", "b", "diff", "low", "high", "verdict")
        return render(columns, [[_raw(v) for v in row] for row in raw], style="csv")
    rows = []
    for r in result.rows:
        fmt = _duration if r.metric in SUMMARY_STAGES else _plain
        interval = (
            "-"
            if r.low is None or r.high is None
            else (f"[{fmt(r.low, True)}, {fmt(r.high, True)}]")
        )
        rows.append([r.cell, r.metric, fmt(r.a), fmt(r.b), fmt(r.diff, True), interval, r.verdict])
    text = render(COLUMNS, rows, style=style)
    counts = {v: sum(1 for r in result.rows if r.verdict == v) for v in ("same", "better", "worse")}
    tail = [f"{len(result.rows)} rows: " + ", ".join(f"{n} {v}" for v, n in counts.items())]
    tail += [f"unmatched: {u}" for u in result.unmatched]
    return text + "\n" + "\n".join(tail)


def _duration(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    text = seconds_text(x)
    return ("+" + text) if signed and x > 0 else text


def _plain(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.3g}" if signed else f"{x:.3g}"


def _raw(v: object) -> object:
    return repr(v) if isinstance(v, float) else ("" if v is None else v)
