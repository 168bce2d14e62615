"""The sweep table: one row per cell, from the cells' summaries and the benchmark's declarations.

Columns: `cell  conc  e2e  err  rew`, then for rollout benchmarks the stages `setup  generation
scoring  total` as `p50 (p10–p90)` seconds, then every metric the benchmark declares as a
column (`Metric.column`: serve's TTFT/TPOT/ITL/E2E p50 and throughputs, agentic's turns and
s/turn). `conc` is the cell's max_concurrent, `∞` when unbounded (`-` for a benchmark without
the axis); `e2e` is the summary's e2e in seconds (the work phase: first rollout or request
started to the last one ended); `err` the failed rollouts (or requests); `rew` the mean reward
over rollouts that have one. Percentiles are `metrale.stats.percentile`.
"""

from __future__ import annotations

from collections.abc import Sequence

from metrale.errors import UsageError
from metrale.matrix.cellfile import CellResult
from metrale.plugin import SUMMARY_STAGES, Metric, get_benchmark
from metrale.stats import Spread
from metrale.table import render

COLUMNS: tuple[str, ...] = ("cell", "conc", "e2e", "err", "rew", *SUMMARY_STAGES)


def declared_metrics(cells: Sequence[CellResult]) -> list[Metric]:
    """The metrics the cells' benchmark declares (none when it is not installed)."""
    names = list(dict.fromkeys(c.benchmark for c in cells))
    if len(names) != 1:
        return []
    try:
        return get_benchmark(names[0])().metrics()
    except UsageError:
        return []


def _columns(cells: Sequence[CellResult]) -> tuple[list[str], list[Metric]]:
    with_stages = any(any(c.durations.get(s) for s in SUMMARY_STAGES) for c in cells)
    extra = [m for m in declared_metrics(cells) if m.column and m.name not in SUMMARY_STAGES]
    cols = ["cell", "conc", "e2e", "err", "rew"]
    if with_stages or not extra:
        cols += list(SUMMARY_STAGES)
    cols += [f"{m.name} ({m.unit})" for m in extra]
    return cols, extra


def report_rows(cells: Sequence[CellResult]) -> list[list[str]]:
    return report_table(cells)[1]


def report_table(cells: Sequence[CellResult]) -> tuple[list[str], list[list[str]]]:
    columns, extra = _columns(cells)
    stages = [s for s in SUMMARY_STAGES if s in columns]
    rows = []
    for c in cells:
        if c.rollouts is None:
            conc = "-"
        else:
            conc = "∞" if c.max_concurrent is None else str(c.max_concurrent)
        rows.append([
            c.cell,
            conc,
            "-" if c.e2e_s is None else f"{c.e2e_s:.2f}",
            str(c.errors),
            "-" if c.reward_mean is None else f"{c.reward_mean:.3f}",
            *(Spread.of(c.stage(s)).cell() for s in stages),
            *(_num(c.metrics.get(m.name)) for m in extra),
        ])  # fmt: skip
    return columns, rows


def _num(x: float | int | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def failure_notes(cells: Sequence[CellResult]) -> list[str]:
    """One line per failed cell: the table alone would hide why a row is empty."""
    return [f"{c.cell}: failed: {c.error}" for c in cells if c.status == "failed"]


def render_report(cells: Sequence[CellResult], style: str = "markdown") -> str:
    """The table as Markdown (for a pull request) or CSV; Markdown lists failed cells below it."""
    columns, rows = report_table(cells)
    table = render(columns, rows, style=style)
    notes = failure_notes(cells)
    if style == "markdown" and notes:
        table += "\n\n" + "\n".join(f"- {n}" for n in notes)
    return table


def seconds_text(x: float, _pos: object = None) -> str:
    """A duration in readable units, 3 significant digits: 250 µs, 12.5 ms, 1.5 s (also a
    matplotlib tick formatter, hence the unused position argument)."""
    if x == 0:
        return "0"
    ax = abs(x)
    if ax < 1e-3:
        return f"{x * 1e6:.3g} µs"
    if ax < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.3g} s"
