"""Tell a real difference between two sets of results from noise: A vs B, metric by metric.

Each row compares one declared metric of two cells (B − A) with a percentile-bootstrap 95%
interval (`metrale.stats.bootstrap_diff`, 2,000 resamples, fixed seed so that the same inputs
always give the same output). The metrics, their statistic and direction are the benchmark's
declarations as the cells' files store them (`RunSummary.declared`, not the benchmark installed
now): for a rollout benchmark the stage p50s (`setup`, `generation`,
`scoring`, `total`), `reward_mean`, `error_rate`, ... and its own; for serve TTFT, TPOT, ITL,
E2E percentiles and the throughputs. The samples are the cells' summaries'.

Cells over a dataset (`RunSummary.per_task`) compare overall and task by task: `pass_at_1`
and `pass_at_k` as the mean over tasks of each task's value, the interval by resampling tasks;
then, for each task in both cells, `reward_mean[task]` and `pass_at_1[task]` over that task's
attempts, the interval by resampling attempts.

Verdict rule, per row: **same** when the interval contains 0, or when the difference is smaller
than the tolerance: `max(rel_tol × |A|, abs_tol)` (defaults 5% and, for durations, 1 ms: below
that, scheduling jitter on a shared machine dominates). Otherwise **better** or **worse** by the
sign of the difference and the metric's direction, or **changed** for a metric with no better
direction (a count of turns). `n/a` when a side has no sample, and for a whole-run value (e2e),
which is one observation per side and so has no interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from metrale.errors import UsageError
from metrale.fmt import duration_text, number_text
from metrale.matrix.cellfile import (
    CellResult,
    cell_from_run_dir,
    is_run_dir,
    read_cell,
    read_cells,
)
from metrale.matrix.report import declared_metrics
from metrale.plugin import SUMMARY_STAGES, Metric, find_metric
from metrale.plugin.per_task import ran
from metrale.stats import bootstrap_diff, mean
from metrale.table import render

Verdict = Literal["same", "better", "worse", "changed", "n/a"]
#: Durations below this differ by scheduling jitter, not by the system under test (seconds).
DURATION_ABS_TOL_S = 0.001
_ABS_TOL = {"s": DURATION_ABS_TOL_S, "ms": DURATION_ABS_TOL_S * 1000}


def abs_tol(metric: Metric) -> float:
    return _ABS_TOL.get(metric.unit, 0.0)


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
    """The rule in the module docstring: same / better / worse / changed for one row."""
    tolerance = max(rel_tol * abs(a), abs_tol(metric))
    if low <= 0 <= high or abs(estimate) <= tolerance:
        return "same"
    if metric.better is None:
        return "changed"
    worse = estimate > 0 if metric.lower_is_better else estimate < 0
    return "worse" if worse else "better"


def metrics_of(cell: CellResult) -> list[Metric]:
    """The metrics `cell`'s file declares (`CellResult.declared`)."""
    return declared_metrics([cell])


def pick_metrics(metrics: Sequence[Metric], names: Sequence[str], benchmark: str) -> list[Metric]:
    """`compare --metric`: the named declared metrics, or all of them when none is named."""
    if not names:
        return list(metrics)
    return [find_metric(metrics, n, what="--metric", benchmark=benchmark) for n in names]


def compare_cells(
    a: CellResult,
    b: CellResult,
    *,
    rel_tol: float = 0.05,
    resamples: int = 2000,
    names: Sequence[str] = (),
) -> list[Row]:
    label = a.cell if a.cell == b.cell else f"{a.cell} vs {b.cell}"
    if a.benchmark != b.benchmark:
        raise UsageError(f"{label}: a {a.benchmark} cell and a {b.benchmark} cell do not compare")
    rows = []
    for m in pick_metrics(metrics_of(a), names, a.benchmark):
        if m.name in DATASET_METRICS and a.per_task and b.per_task:
            rows.append(_dataset_row(label, m, a, b, rel_tol, resamples))
        else:
            rows.append(_row(label, m, a, b, rel_tol, resamples))
    if a.per_task and b.per_task and (not names or set(names) & set(TASK_METRICS)):
        rows += _task_rows(label, a, b, rel_tol, resamples, names)
    return rows


#: A dataset's whole-run numbers compared over its tasks (`plugin.per_task`).
DATASET_METRICS = ("pass_at_1", "pass_at_k")
#: What is compared task by task: each over the task's attempts.
TASK_METRICS = ("reward_mean", "pass_at_1")


def _k(cell: CellResult, metric: str) -> int:
    return 1 if metric == "pass_at_1" else int(cell.metrics.get("attempts") or 1)


def _dataset_row(
    label: str, m: Metric, a: CellResult, b: CellResult, rel_tol: float, resamples: int
) -> Row:
    """pass@1 or pass@k of two datasets: the mean over tasks of each task's value, the
    interval by resampling tasks (each side's own k)."""
    xa = [x for t in ran(a.per_task) if (x := t.pass_at(_k(a, m.name))) is not None]
    xb = [x for t in ran(b.per_task) if (x := t.pass_at(_k(b, m.name))) is not None]
    return _bootstrapped(label, m.name, xa, xb, m, rel_tol, resamples)


def _task_rows(
    label: str, a: CellResult, b: CellResult, rel_tol: float, resamples: int,
    names: Sequence[str],
) -> list[Row]:  # fmt: skip
    """Per task in both cells: reward_mean over its attempts' rewards, pass_at_1 over its
    attempts' 0/1 passes, each with a bootstrap interval over the attempts."""
    by_name = {t.name: t for t in b.per_task}
    rows = []
    for ta in a.per_task:
        tb = by_name.get(ta.name)
        if tb is None or ta.skipped is not None or tb.skipped is not None:
            continue
        for metric in TASK_METRICS:
            if names and metric not in names:
                continue
            m = Metric(metric, "fraction", "higher", doc="", stat="mean")
            xa, xb = (ta.rewards, tb.rewards) if metric == "reward_mean" else (ta.passed, tb.passed)
            rows.append(_bootstrapped(label, f"{metric}[{ta.name}]", xa, xb, m, rel_tol, resamples))
    return rows


def _bootstrapped(
    label: str, name: str, xa: list[float], xb: list[float], m: Metric, rel_tol: float,
    resamples: int,
) -> Row:  # fmt: skip
    sa, sb = mean(xa), mean(xb)
    if sa is None or sb is None:
        return Row(label, name, sa, sb, None, None, None, "n/a")
    iv = bootstrap_diff(xa, xb, mean, resamples=resamples)
    return Row(label, name, sa, sb, iv.estimate, iv.low, iv.high,
               verdict(iv.estimate, iv.low, iv.high, sa, m, rel_tol))  # fmt: skip


def _row(
    label: str, m: Metric, a: CellResult, b: CellResult, rel_tol: float, resamples: int
) -> Row:
    if m.stat == "value":
        va, vb = a.metrics.get(m.name), b.metrics.get(m.name)
        if m.name == "e2e_s":
            va, vb = a.e2e_s, b.e2e_s
        diff = None if va is None or vb is None else float(vb) - float(va)
        return Row(label, m.name, _f(va), _f(vb), diff, None, None, "n/a")
    xa: list[Any] = a.sample(m.name)
    xb: list[Any] = b.sample(m.name)
    sa, sb = m.compute(xa), m.compute(xb)
    if not xa or not xb or sa is None or sb is None:
        return Row(label, m.name, sa, sb, None, None, None, "n/a")
    try:
        iv = bootstrap_diff(xa, xb, m.compute, resamples=resamples)
    except ValueError:  # a resample without a value (a ratio's denominators all 0): no interval
        return Row(label, m.name, sa, sb, sb - sa, None, None, "n/a")
    v = verdict(iv.estimate, iv.low, iv.high, sa, m, rel_tol)
    return Row(label, m.name, sa, sb, iv.estimate, iv.low, iv.high, v)


def _f(x: float | int | None) -> float | None:
    return None if x is None else float(x)


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
    #: the declared metrics of the rows (their units decide how numbers are shown)
    metrics: list[Metric] = field(default_factory=list)

    @property
    def worse(self) -> bool:
        return any(r.verdict == "worse" for r in self.rows)


def compare_paths(
    a: Path, b: Path, *, rel_tol: float = 0.05, resamples: int = 2000, names: Sequence[str] = ()
) -> Comparison:
    """Compare two inputs; two sweep directories are matched cell by cell, by name."""
    side_a, side_b = load_side(a), load_side(b)
    kw: dict[str, Any] = {"rel_tol": rel_tol, "resamples": resamples, "names": names}
    if isinstance(side_a, CellResult) and isinstance(side_b, CellResult):
        rows = compare_cells(side_a, side_b, **kw)
        return Comparison(rows, [], metrics_of(side_a))
    if isinstance(side_a, CellResult) or isinstance(side_b, CellResult):
        raise UsageError(
            "compare a cell with a cell and a sweep directory with a sweep directory "
            f"({a} and {b} differ in kind)"
        )
    by_name = {c.cell: c for c in side_b}
    rows = []
    unmatched = [
        f"{c.cell} (only in {b})" for c in side_b if c.cell not in {x.cell for x in side_a}
    ]
    for cell in side_a:
        other = by_name.get(cell.cell)
        if other is None:
            unmatched.insert(0, f"{cell.cell} (only in {a})")
            continue
        rows += compare_cells(cell, other, **kw)
    if not rows:
        raise UsageError(f"{a} and {b} have no cell name in common")
    return Comparison(rows, unmatched, metrics_of(side_a[0]) if side_a else [])


COLUMNS = ("cell", "metric", "A", "B", "B−A", "95% interval", "verdict")


def render_comparison(result: Comparison, style: str = "plain") -> str:
    """A table row per metric; durations in readable units, error rate and reward as is.
    CSV carries raw numbers (durations in seconds) and the interval as two columns."""
    if style == "csv":
        raw = [[r.cell, r.metric, r.a, r.b, r.diff, r.low, r.high, r.verdict] for r in result.rows]
        columns = ("cell", "metric", "a", "b", "diff", "low", "high", "verdict")
        return render(columns, [[_raw(v) for v in row] for row in raw], style="csv")
    units = _units(result)
    rows = []
    for r in result.rows:
        fmt = _duration if units.get(r.metric) == "s" else _plain
        interval = (
            "-"
            if r.low is None or r.high is None
            else (f"[{fmt(r.low, True)}, {fmt(r.high, True)}]")
        )
        rows.append([r.cell, r.metric, fmt(r.a), fmt(r.b), fmt(r.diff, True), interval, r.verdict])
    text = render(COLUMNS, rows, style=style)
    counts = {
        v: sum(1 for r in result.rows if r.verdict == v)
        for v in ("same", "better", "worse", "changed")
    }
    tail = [f"{len(result.rows)} rows: " + ", ".join(f"{n} {v}" for v, n in counts.items())]
    tail += [f"unmatched: {u}" for u in result.unmatched]
    return text + "\n" + "\n".join(tail)


def _units(result: Comparison) -> dict[str, str]:
    """Each row's unit: the declared one; a summary stage is seconds by the summary's own
    definition (`RunSummary.durations`), declared or not."""
    return {**dict.fromkeys(SUMMARY_STAGES, "s"), **{m.name: m.unit for m in result.metrics}}


def _duration(x: float | None, signed: bool = False) -> str:
    return duration_text(x, signed=signed)


def _plain(x: float | None, signed: bool = False) -> str:
    return number_text(x, signed=signed)


def _raw(v: object) -> object:
    return repr(v) if isinstance(v, float) else ("" if v is None else v)
