"""A cell over a dataset keeps its per-task breakdown through its file, and report, compare,
the plot and the HTML drill-down show it: synthetic cells, no run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metrale.matrix.cellfile import read_cell, write_cell
from metrale.matrix.compare import compare_cells
from metrale.matrix.drilldown import drilldown_html
from metrale.matrix.report import render_report
from metrale.plugin import get_benchmark
from metrale.plugin.per_task import TaskSummary, dataset_numbers
from tests.matrix.helpers import make_cell


def dataset_cell(name: str, passes: dict[str, list[float]], k: int = 4):  # type: ignore[no-untyped-def]
    tasks = [
        TaskSummary(name=t, attempts=len(p), passed=p, rewards=p, stage_p50_s={"setup": 0.5})
        for t, p in passes.items()
    ]
    tasks.append(TaskSummary(name="gpu-task", skipped="task gpu-task: gpus = 1: refused"))
    cell = make_cell(name, rollouts=sum(len(p) for p in passes.values()))
    cell.benchmark = "terminal_bench"
    cell.declared = [m.declaration() for m in get_benchmark("terminal_bench")().metrics()]
    cell.per_task = tasks
    cell.metrics.update(dataset_numbers(tasks, k))
    return cell


A = {"easy": [1.0, 1.0, 1.0, 1.0], "flaky": [1.0, 0.0, 0.0, 0.0], "hard": [0.0] * 4}
B = {"easy": [1.0, 1.0, 1.0, 1.0], "flaky": [1.0, 1.0, 1.0, 0.0], "hard": [0.0] * 4}


def test_the_breakdown_survives_the_cell_file(tmp_path: Path) -> None:
    cell = dataset_cell("docker-r12", A)
    back = read_cell(write_cell(tmp_path, cell))
    assert back.per_task == cell.per_task
    assert back.metrics["pass_at_1"] == pytest.approx((1 + 0.25 + 0) / 3)
    assert back.metrics["pass_at_k"] == pytest.approx(2 / 3)
    assert back.metrics["tasks_solved"] == 2 and back.metrics["tasks_skipped"] == 1


def test_report_shows_a_row_per_task_and_the_dataset_line(tmp_path: Path) -> None:
    cell = read_cell(write_cell(tmp_path, dataset_cell("docker-r12", A)))
    text = render_report([cell], "plain")
    assert "docker-r12: dataset: 4 tasks (1 skipped) x 4 attempts" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert rows["flaky"].split()[1:5] == ["4", "0.25", "0.25", "1"]
    assert "gpus = 1: refused" in rows["gpu-task"]
    exported = json.loads(render_report([cell], "json"))["cells"][0]
    assert [t["name"] for t in exported["per_task"]] == ["easy", "flaky", "hard", "gpu-task"]
    assert exported["pass_at_k"] == pytest.approx(2 / 3)


def test_compare_gives_overall_and_per_task_rows_with_intervals() -> None:
    rows = {r.metric: r for r in compare_cells(dataset_cell("c", A), dataset_cell("c", B))}
    overall = rows["pass_at_1"]
    assert (overall.a, overall.b) == (pytest.approx(1.25 / 3), pytest.approx(1.75 / 3))
    assert overall.low is not None and overall.high is not None
    flaky = rows["pass_at_1[flaky]"]
    assert (flaky.a, flaky.b, flaky.diff) == (0.25, 0.75, 0.5)
    assert flaky.low is not None and flaky.low <= 0.5 <= (flaky.high or 0)
    assert rows["pass_at_1[easy]"].verdict == "same"
    assert "pass_at_1[gpu-task]" not in rows  # skipped on both sides: nothing to compare
    assert set(rows) >= {"reward_mean[hard]", "pass_at_k"}


def test_the_drilldown_lists_the_tasks() -> None:
    html = drilldown_html(dataset_cell("c", A), None)
    assert "<h3>tasks</h3>" in html and "flaky" in html and "gpus = 1: refused" in html


def test_the_plot_adds_pass_at_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from metrale.matrix.plot import panels_for

    titles = [p.title for p in panels_for([dataset_cell("c", A)])]
    assert titles[-2:] == ["pass@1", "pass@k"]
    point = panels_for([dataset_cell("c", A)])[-1].point(dataset_cell("c", A))
    assert point is not None and point[0] == pytest.approx(2 / 3)
