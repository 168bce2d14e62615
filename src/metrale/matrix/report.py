"""The sweep table: one row per cell, stage durations as `p50 (p10–p90)` seconds.

Columns: `cell  conc  e2e  err  rew  setup  generation  scoring  total`. `conc` is the cell's
max_concurrent, `∞` when unbounded; `e2e` is the cell's wall clock in seconds; `err` the number
of rollouts that failed; `rew` the mean reward over rollouts that have one. Percentiles are
`metrale.stats.percentile` (linear interpolation) over the cell's per-rollout durations.
"""

from __future__ import annotations

from collections.abc import Sequence

from metrale.matrix.cellfile import CellResult
from metrale.rollout import SUMMARY_STAGES
from metrale.stats import Spread
from metrale.table import render

COLUMNS: tuple[str, ...] = ("cell", "conc", "e2e", "err", "rew", *SUMMARY_STAGES)


def report_rows(cells: Sequence[CellResult]) -> list[list[str]]:
    rows = []
    for c in cells:
        rows.append([
            c.cell,
            "∞" if c.max_concurrent is None else str(c.max_concurrent),
            "-" if c.e2e_s is None else f"{c.e2e_s:.2f}",
            str(c.errors),
            "-" if c.reward_mean is None else f"{c.reward_mean:.3f}",
            *(Spread.of(c.stage(s)).cell() for s in SUMMARY_STAGES),
        ])  # fmt: skip
    return rows


def failure_notes(cells: Sequence[CellResult]) -> list[str]:
    """One line per failed cell: the table alone would hide why a row is empty."""
    return [f"{c.cell}: failed: {c.error}" for c in cells if c.status == "failed"]


def render_report(cells: Sequence[CellResult], style: str = "markdown") -> str:
    """The table as Markdown (for a pull request) or CSV; Markdown lists failed cells below it."""
    table = render(COLUMNS, report_rows(cells), style=style)
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
