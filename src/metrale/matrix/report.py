"""The sweep table and its exports: one row per cell, from the cells' summaries and the metric
declarations stored with them (`RunSummary.declared`; the installed benchmark's only for a file
written before they were stored).

The table (Markdown or plain): `cell  conc  e2e (s)  err  rew`, then for rollout benchmarks
the stages `setup  generation  scoring  total` as `p50 (p10–p90)` (with `pool_start`,
`setup_wait` and `stop` when a cell has them, as in `run`'s table), each column in the one unit
(µs, ms or s) that `metrale.fmt` chooses for it and names in its header, then every metric the
benchmark declares as a column (`Metric.column`). `conc` is the cell's max_concurrent, `∞` when
unbounded (`-` for a benchmark without the axis); `e2e` is the summary's `e2e_s` (the work
phase: first rollout or request started to the last one ended), the same number `run` and
`matrix` print; `err` the failed rollouts (or requests); `rew` the mean reward over rollouts
that have one. Percentiles are `metrale.stats.percentile`.

The exports are for analysis, not reading: numbers only, seconds for every duration.
`export_rows` gives one flat dict per cell (`<stage>_p10_s`, `_p50_s`, `_p90_s`,
`max_concurrent` None when unbounded, every declared metric as a number); CSV writes None as an
empty field, JSON as null. A cell over a dataset (terminal_bench, several tasks) adds its
per-task table below the sweep's (`plugin.per_task`), and its JSON row the breakdown.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from metrale.errors import UsageError
from metrale.fmt import (
    duration_text,
    duration_unit,
    in_unit,
    number_text,
    safe_json,
    safe_text,
    spread_column,
)
from metrale.matrix.cellfile import CellResult, with_declarations
from metrale.plugin import SUMMARY_STAGES, Metric, Status, shown_stages
from metrale.plugin.per_task import dataset_line, per_task_table
from metrale.stats import Spread
from metrale.table import render

STYLES: tuple[str, ...] = ("markdown", "plain", "csv", "json")


def declared_metrics(cells: Sequence[CellResult]) -> list[Metric]:
    """The metrics the cells' files declare (`RunSummary.declared`, in the order of the first
    cell that declares each); none for cells of more than one benchmark. A cell that declares
    none (made in memory, or an old file read without `read_cell`) is read with today's
    declarations of its benchmark, as every cell was before files carried them."""
    if len({c.benchmark for c in cells}) != 1:
        return []
    found: dict[str, Metric] = {}
    for c in cells:
        for d in with_declarations(c.model_copy()).declared:
            found.setdefault(d.name, d.metric())
    return list(found.values())


def has_stages(cells: Sequence[CellResult]) -> bool:
    return any(any(c.durations.get(s) for s in SUMMARY_STAGES) for c in cells)


def column_metrics(cells: Sequence[CellResult]) -> list[Metric]:
    """The declared metrics the table shows beside the stages."""
    return [m for m in declared_metrics(cells) if m.column and m.name not in SUMMARY_STAGES]


def report_rows(cells: Sequence[CellResult]) -> list[list[str]]:
    return report_table(cells)[1]


def report_table(cells: Sequence[CellResult]) -> tuple[list[str], list[list[str]]]:
    """Headers and text rows of the table, columns in the units `metrale.fmt` picks."""
    extra = column_metrics(cells)
    stages = shown_stages(*cells) if has_stages(cells) or not extra else []
    e2e_unit = duration_unit(c.e2e_s for c in cells)
    columns = ["cell", "conc", f"e2e ({e2e_unit})", "err", "rew"]
    body: list[list[str]] = [
        [
            c.cell,
            _conc(c),
            in_unit(c.e2e_s, e2e_unit),
            str(c.errors),
            number_text(c.reward_mean),
        ]
        for c in cells
    ]
    for stage in stages:
        unit, texts = spread_column(Spread.of(c.stage(stage)) for c in cells)
        columns.append(f"{stage} ({unit})")
        for row, text in zip(body, texts, strict=True):
            row.append(text)
    columns += [f"{m.name} ({m.unit})" for m in extra]
    for row, c in zip(body, cells, strict=True):
        row += [number_text(c.metrics.get(m.name)) for m in extra]
    return columns, body


def _conc(c: CellResult) -> str:
    if c.rollouts is None:
        return "-"
    return "∞" if c.max_concurrent is None else str(c.max_concurrent)


def export_rows(cells: Sequence[CellResult]) -> list[dict[str, Any]]:
    """One flat dict of numbers per cell: identity, e2e and counts, each stage's p10/p50/p90 in
    seconds, and every declared metric's value (None where it was not measured)."""
    metrics = [m for m in declared_metrics(cells) if m.name not in SUMMARY_STAGES]
    names = list(dict.fromkeys(m.name for m in metrics))
    for c in cells:  # a benchmark not installed: whatever the files hold
        names += [k for k in c.metrics if k not in names and not metrics]
    stages = shown_stages(*cells) if has_stages(cells) else []
    rows = []
    for c in cells:
        row: dict[str, Any] = {
            "cell": c.cell,
            "benchmark": c.benchmark,
            "tier": c.tier,
            "runtime": c.runtime,
            "rollouts": c.rollouts,
            "max_concurrent": c.max_concurrent,
            "status": c.status,
            "records": c.records,
            "errors": c.errors,
            "e2e_s": c.e2e_s,
            "reward_mean": c.reward_mean,
        }
        for stage in stages:
            s = Spread.of(c.stage(stage))
            row[f"{stage}_p10_s"], row[f"{stage}_p50_s"], row[f"{stage}_p90_s"] = (
                s.p10,
                s.p50,
                s.p90,
            )
        for name in names:
            if name not in row:
                value = c.metrics.get(name)
                row[name] = value if isinstance(value, int | float) else None
        row["model"] = c.model
        row["error"] = c.error
        rows.append(row)
    return rows


def export_csv(cells: Sequence[CellResult]) -> str:
    """`export_rows` as CSV: numbers as Python writes them (full precision), None empty."""
    rows = export_rows(cells)
    if not rows:
        return ""
    columns = list(rows[0])
    return render(columns, [[_csv(r.get(k)) for k in columns] for r in rows], style="csv")


def _csv(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def export_json(cells: Sequence[CellResult]) -> str:
    """`export_rows` as a JSON document, each row with its cell's parameters (and a dataset
    cell's per-task breakdown, `per_task`)."""
    rows = export_rows(cells)
    for row, c in zip(rows, cells, strict=True):
        row["params"] = c.params
        if c.per_task:
            row["per_task"] = [t.model_dump() for t in c.per_task]
    return safe_json(json.dumps({"cells": rows}, indent=1, ensure_ascii=False))


def failure_notes(cells: Sequence[CellResult]) -> list[str]:
    """One line per failed cell: the table alone would hide why a row is empty."""
    failed = [c for c in cells if c.status == Status.FAILED]
    return [safe_text(f"{c.cell}: failed: {c.error}", lines=False) for c in failed]


def render_report(cells: Sequence[CellResult], style: str = "markdown") -> str:
    """The table as Markdown (for a pull request) or plain text, or an export (CSV, JSON);
    Markdown lists failed cells below the table."""
    if style == "csv":
        return export_csv(cells)
    if style == "json":
        return export_json(cells)
    if style not in STYLES:
        raise UsageError(f"report style {style!r}; accepted: {', '.join(STYLES)}")
    columns, rows = report_table(cells)
    table = render(columns, rows, style=style)
    notes = failure_notes(cells)
    if style == "markdown" and notes:
        table += "\n\n" + "\n".join(f"- {n}" for n in notes)
    for c in cells:  # a cell over a dataset: its tasks, one row each
        if len(c.per_task) > 1:
            k = int(c.metrics.get("attempts") or 1)
            head = f"{c.cell}: {dataset_line(c.per_task, k)}"
            table += f"\n\n{head}\n\n" + render(*per_task_table(c.per_task, k), style=style)
    return table


def seconds_text(x: float, _pos: object = None) -> str:
    """A duration in readable units, 3 significant digits: 250 µs, 12.5 ms, 1.5 s (also a
    matplotlib tick formatter, hence the unused position argument)."""
    return "0" if x == 0 else duration_text(x)
