"""Run the cells of a sweep one after another, each through the runner, one file per cell.

Cells run sequentially so that one cell's rollouts never compete with another's for the target
or the machine: a cell's numbers are its own. Each cell is a normal run (`<out>/runs/<cell>/`
holds its run.json and rollouts.jsonl) and its summary is written to `<out>/<cell>.json` as soon
as it ends. A cell that fails is written with its error and the sweep goes on; an interrupt
stops the sweep and leaves the cells already written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from metrale import runner
from metrale.endpoint.client import ClientOptions, Target
from metrale.errors import UsageError
from metrale.matrix.cellfile import CellResult, read_cell, read_records, summarize, write_cell
from metrale.matrix.sweep import AXIS_PARAMS, Cell, Sweep, resolve_runtime
from metrale.plugin import get_benchmark
from metrale.runtime.base import RuntimeConfig
from metrale.stats import Spread


@dataclass
class SweepPlan:
    """A checked sweep: its cells and the runtime config of each runtime axis value."""

    sweep: Sweep
    cells: list[Cell]
    runtimes: dict[str, RuntimeConfig | None] = field(default_factory=dict)


def plan_sweep(sweep: Sweep) -> SweepPlan:
    """Check every axis value and every parameter combination before any cell runs.

    A rollouts axis left unset takes the benchmark's own default. Raises `UsageError` naming the
    first bad value and what is accepted.
    """
    bench_cls = get_benchmark(sweep.benchmark)
    specs = {s.name: s for s in bench_cls().parameters()}
    missing = [p for p in AXIS_PARAMS if p not in specs]
    if missing:
        raise UsageError(
            f"benchmark {sweep.benchmark} has no {missing[0]} parameter, so it cannot be swept"
        )
    if sweep.rollouts == [None]:
        sweep.rollouts = [specs["rollouts"].default]
    runtimes = {
        name: resolve_runtime(name, sweep.runtime_options.get(name, {})) for name in sweep.runtimes
    }
    unused = set(sweep.runtime_options) - set(sweep.runtimes)
    if unused:
        raise UsageError(f"runtime_options.{sorted(unused)[0]} names a runtime not in the sweep")
    cells = sweep.cells()
    seen: set[str] = set()
    for cell in cells:
        raw = {**cell.params, "rollouts": cell.rollouts, "max_concurrent": cell.max_concurrent}
        key = repr(sorted(raw.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            bench_cls().configure(raw)
    return SweepPlan(sweep=sweep, cells=cells, runtimes=runtimes)


async def run_sweep(
    plan: SweepPlan,
    targets: Mapping[str, Target],
    *,
    client_options: ClientOptions | None = None,
    preflight: bool = True,
    progress: TextIO | None = sys.stderr,
    report: TextIO | None = sys.stdout,
    cells: Sequence[Cell] | None = None,
    runtime_retries: int = 0,
    resume: bool = False,
) -> list[CellResult]:
    """Run `cells` (default: all of the plan) and write one file each; return their summaries.

    `targets` maps tier name to its probed target. The 2+2 preflight runs once per tier, on its
    first cell, not once per cell: it checks the target, not the cell. With `resume`, a cell
    whose file says it completed is not run again (its file is returned as it is); any other
    cell runs afresh, replacing what its run directory held.
    """
    todo = list(plan.cells if cells is None else cells)
    options = client_options or ClientOptions()
    checked: set[str] = set()
    results = []
    for i, cell in enumerate(todo, 1):
        done = _completed_cell(plan.sweep.out, cell) if resume else None
        if done is not None:
            if report is not None:
                print(f"[{i}/{len(todo)}] {cell.name}  completed earlier: kept", file=report)
            results.append(done)
            continue
        target = targets[cell.tier.name]
        request = runner.RunRequest(
            benchmark=plan.sweep.benchmark,
            params={
                **cell.params,
                "rollouts": cell.rollouts,
                "max_concurrent": cell.max_concurrent,
            },
            target=target,
            client_options=options,
            runtime=plan.runtimes[cell.runtime],
            runtime_retries=runtime_retries,
            out=plan.sweep.out / "runs" / cell.name,
            overwrite=True,  # a cell's run directory is the sweep's: re-running replaces it
            preflight=preflight and cell.tier.name not in checked,
            progress=progress,
        )
        checked.add(cell.tier.name)
        result = await run_cell(cell, request)
        write_cell(plan.sweep.out, result)
        if report is not None:
            print(f"[{i}/{len(todo)}] {cell_line(result)}", file=report, flush=True)
        results.append(result)
    return results


def _completed_cell(out: Path, cell: Cell) -> CellResult | None:
    """The cell's file when it says completed; None when absent, failed or unreadable."""
    path = out / f"{cell.name}.json"
    if not path.is_file():
        return None
    try:
        found = read_cell(path)
    except UsageError:
        return None
    return found if found.status == "completed" else None


async def run_cell(cell: Cell, request: runner.RunRequest) -> CellResult:
    """One cell through the runner; any failure becomes the cell's error, never the sweep's."""
    base = CellResult(
        cell=cell.name,
        benchmark=request.benchmark,
        tier=None if cell.tier.name == "default" else cell.tier.name,
        runtime=cell.runtime,
        runtime_config=request.runtime.model_dump() if request.runtime else None,
        rollouts=cell.rollouts,
        max_concurrent=cell.max_concurrent,
        params=dict(cell.params),
        target=request.target.base_url,
        model=request.target.model,
        started_at=datetime.now(UTC).isoformat(),
        run_dir=str(request.out),
    )
    started = time.perf_counter()
    try:
        outcome = await runner.run(request)
    except Exception as exc:  # the cell failed to run at all: record why and go on
        base.status, base.error = "failed", _one_line(exc)
        base.e2e_s = time.perf_counter() - started
        assert request.out is not None
        return summarize(read_records(request.out / "rollouts.jsonl"), base)
    base.started_at = outcome.info.started_at
    base.params = {k: v for k, v in outcome.info.params.items() if k not in AXIS_PARAMS}
    base.metrale_version = outcome.info.metrale_version
    base.e2e_s = outcome.e2e_s
    if outcome.result.status.value != "completed":
        base.status, base.error = "failed", outcome.result.error or "run failed"
    return summarize(read_records(request.out / "rollouts.jsonl"), base)  # type: ignore[operator]


def cell_line(cell: CellResult) -> str:
    """The line printed as each cell finishes."""
    total = Spread.of(cell.stage("total"))
    e2e = "-" if cell.e2e_s is None else f"{cell.e2e_s:.2f} s"
    reward = "-" if cell.reward_mean is None else f"{cell.reward_mean:.3f}"
    text = (
        f"{cell.cell}  e2e {e2e}  err {cell.errors}/{cell.rollouts}  rew {reward}  "
        f"total {total.cell()} s"
    )
    if cell.status == "failed":
        text += f"  FAILED: {cell.error}"
    return text


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__
