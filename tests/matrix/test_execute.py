"""Running a sweep in-process: a cell that fails is written with its error, the rest go on."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from metrale import runner
from metrale.endpoint.client import Target
from metrale.matrix.cellfile import read_cells
from metrale.matrix.execute import plan_sweep, run_sweep
from metrale.matrix.sweep import Sweep
from tests.conftest import Sim


def test_a_failed_cell_is_written_with_its_error_and_the_sweep_goes_on(
    sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = runner.run

    async def flaky_run(request: runner.RunRequest) -> runner.RunResult:
        if request.out is not None and request.out.name == "none-r2-c1":
            raise RuntimeError("the target went away\nsecond line")
        return await real_run(request)

    monkeypatch.setattr(runner, "run", flaky_run)
    plan = plan_sweep(
        Sweep("gsm8k", tmp_path, ["none"], [2, 3], [None, 1], params={"max_tokens": [4]})
    )
    report = io.StringIO()
    target = Target(base_url=sim.url, model=sim.model)
    results = asyncio.run(run_sweep(plan, {"default": target}, progress=None, report=report))
    assert [r.status for r in results] == ["completed", "failed", "completed", "completed"]
    cells = {c.cell: c for c in read_cells(tmp_path)}
    assert set(cells) == {"none-r2", "none-r2-c1", "none-r3", "none-r3-c1"}
    failed = cells["none-r2-c1"]
    assert failed.error == "RuntimeError: the target went away"
    assert failed.max_concurrent == 1 and failed.records == 0
    assert cells["none-r3-c1"].records == 3 and cells["none-r3-c1"].error is None
    lines = report.getvalue().splitlines()
    assert len(lines) == 4 and "FAILED: RuntimeError: the target went away" in lines[1]


def test_preflight_runs_once_per_tier_and_runtime_retries_reach_the_runner(
    sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[bool, int]] = []
    real_run = runner.run

    async def spy(request: runner.RunRequest) -> runner.RunResult:
        seen.append((request.preflight, request.runtime_retries))
        return await real_run(request)

    monkeypatch.setattr(runner, "run", spy)
    plan = plan_sweep(Sweep("gsm8k", tmp_path, ["none"], [1, 2], [None]))
    target = Target(base_url=sim.url, model=sim.model)
    asyncio.run(run_sweep(plan, {"default": target}, progress=None, report=None, runtime_retries=2))
    assert seen == [(True, 2), (False, 2)]
