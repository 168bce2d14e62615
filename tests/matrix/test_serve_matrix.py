"""serve swept like the rollout benchmarks: its declared load axes, a cell each, numeric compare."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.matrix.cellfile import read_cells
from metrale.matrix.execute import plan_sweep
from metrale.matrix.sweep import Sweep
from tests.conftest import run_cli, start_sim


def test_matrix_serve_over_concurrency(tmp_path: Path) -> None:
    out = tmp_path / "mx"
    with start_sim("--ttft", "0.02", "--itl", "0.002", "--output-tokens", "8") as sim:
        done = run_cli(["matrix", "serve", "-p", "concurrency=1,4", "-p", "requests=24",
                        "--target", sim.url, "--no-preflight", "--out", str(out)])  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        runs = {}
        for c in (1, 4):
            runs[c] = tmp_path / f"run{c}"
            assert run_cli(["run", "serve", "--concurrency", str(c), "--requests", "24",
                            "--target", sim.url, "--no-preflight",
                            "--out", str(runs[c])]).returncode == 0  # fmt: skip
    cells = {c.cell: c for c in read_cells(out)}
    assert sorted(cells) == ["concurrency=1", "concurrency=4"]
    for name, cell in cells.items():
        assert cell.unit == "request" and cell.records == 24 and cell.errors == 0, name
        assert len(cell.samples["ttft_ms_p50"]) == 24 and cell.metrics["ttft_ms_p50"] > 15
        assert cell.rollouts is None and "concurrency" in cell.params
    # more requests in flight against a server with no capacity limit: more throughput
    r1 = cells["concurrency=1"].metrics["request_throughput"]
    r4 = cells["concurrency=4"].metrics["request_throughput"]
    assert r1 is not None and r4 is not None and r4 > 2 * r1
    report = run_cli(["report", str(out)]).stdout
    assert len([line for line in report.splitlines() if line.startswith("| concurrency=")]) == 2
    assert "ttft_ms_p50" in report
    # two run directories compare the same way: numeric TTFT rows with intervals
    got = run_cli(["compare", str(runs[1]), str(runs[4]), "--csv", "--metric", "ttft_ms_p50"])
    rows = list(csv.DictReader(io.StringIO(got.stdout)))
    assert [r["metric"] for r in rows] == ["ttft_ms_p50"]
    assert all(float(rows[0][k]) > 0 for k in ("a", "b")) and rows[0]["low"] != ""
    single = run_cli(["report", str(runs[1])]).stdout  # a run directory is one row, not levels
    assert len([line for line in single.splitlines() if line.startswith("| run1")]) == 1


def test_serve_refuses_what_it_does_not_use(tmp_path: Path) -> None:
    for flags, needle in (
        (["--runtime", "bwrap"], "--runtime does not apply to serve"),
        (["-p", "concurrency=1,4", "--rollouts", "2"], "unknown parameter 'rollouts'"),
        (["-p", "no_such=1,2"], "no parameter 'no_such'"),
        (["-p", "warmup=1,2"], "cannot sweep 'warmup'"),
    ):
        done = run_cli(["matrix", "serve", "--target", "http://127.0.0.1:9/v1", *flags,
                        "--out", str(tmp_path / "mx")])  # fmt: skip
        assert done.returncode == 2 and needle in done.stderr, (flags, done.stderr)
        assert "Traceback" not in done.stderr and not (tmp_path / "mx").exists()
    done = run_cli(["run", "serve", "--runtime", "bwrap", "--target", "http://127.0.0.1:9/v1"])
    assert done.returncode == 2 and "serve" in done.stderr and "Traceback" not in done.stderr


def test_a_live_serve_sweep_takes_the_runtime_axis(tmp_path: Path) -> None:
    """serve takes a runtime only as configured (its live sessions' sandboxes): the sweep's
    runtime axis is judged on the cells' configuration, not refused on the bare benchmark."""
    live: dict[str, list[object]] = {
        "load": ["sessions"], "session_source": ["live"],
        "live_benchmark": ["agentic_webserver"], "lanes": [1, 2],
    }  # fmt: skip
    sweep = Sweep("serve", tmp_path, ["bwrap"], [None], [None], params=live, runtime_given=True)
    plan = plan_sweep(sweep)
    runtime = plan.runtimes["bwrap"]
    assert runtime is not None and runtime.type == "bwrap"
    assert [(c.runtime, c.params["lanes"]) for c in plan.cells] == [("bwrap", 1), ("bwrap", 2)]
    bare = Sweep("serve", tmp_path, ["bwrap"], [None], [None], params={"concurrency": [1, 2]},
                 runtime_given=True)  # fmt: skip
    with pytest.raises(UsageError, match="takes no --runtime"):
        plan_sweep(bare)
