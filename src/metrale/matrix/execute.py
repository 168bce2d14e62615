"""Run the cells of a sweep one after another, each through the runner, one file per cell.

Cells run sequentially so that one cell's rollouts never compete with another's for the target
or the machine: a cell's numbers are its own. Each cell is a normal run (`<out>/runs/<cell>/`
holds its run.json and rollouts.jsonl) and its summary is written to `<out>/<cell>.json` as soon
as it ends. A cell that fails is written with its error and the sweep goes on; an interrupt
stops the sweep and leaves the cells already written.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from metrale import runner
from metrale.errors import UsageError
from metrale.fmt import safe_text
from metrale.matrix.cellfile import CellResult, read_cell, summarize, write_cell
from metrale.matrix.sweep import NO_RUNTIME, Cell, Sweep
from metrale.plugin import Benchmark, Status, canonical_id, get_benchmark
from metrale.plugin.params import STANDARD_AXES
from metrale.rundir import read_records
from metrale.stats import Spread

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # types only: the runner is what runs a cell there
    from metrale.endpoint.client import ClientOptions, Target
    from metrale.runtime.base import RuntimeConfig


@dataclass
class SweepPlan:
    """A checked sweep: its cells and the runtime config of each runtime axis value."""

    sweep: Sweep
    cells: list[Cell]
    runtimes: dict[str, RuntimeConfig | None] = field(default_factory=dict)


def plan_sweep(sweep: Sweep) -> SweepPlan:
    """Check every axis value and every parameter combination before any cell runs.

    The benchmark's declarations decide what may be swept (`sweep_axes`), where it may run
    (`runtime_choice`) and whether it takes a runtime at all (`options`). A rollouts axis left
    unset takes the benchmark's own default; a runtime axis left unset, its default runtime.
    Raises `UsageError` naming the first bad value and what is accepted.
    """
    bench_cls = get_benchmark(sweep.benchmark)
    sweep.benchmark = canonical_id(sweep.benchmark)
    bench = bench_cls()
    specs = {s.name: s for s in bench.parameters()}
    axes = bench.sweep_axes()
    for name, values in sweep.params.items():
        if name not in specs:
            raise UsageError(
                f"{sweep.benchmark} has no parameter {name!r}; its parameters: " + ", ".join(specs)
            )
        if len(values) > 1 and name not in axes:
            raise UsageError(
                f"{sweep.benchmark} cannot sweep {name!r}; its sweep axes: {', '.join(axes)}"
            )
    for axis, counts in (("rollouts", sweep.rollouts), ("max_concurrent", sweep.max_concurrent)):
        if counts != [None] and axis not in axes:
            flag = "--" + axis.replace("_", "-")
            raise UsageError(
                f"{sweep.benchmark} has no {axis} axis, so {flag} does not apply; "
                f"its sweep axes: {', '.join(axes)}"
            )
    if sweep.rollouts == [None] and "rollouts" in specs:
        sweep.rollouts = [specs["rollouts"].default]
    runtimes = _plan_runtimes(sweep, runtime_judge(sweep, bench))
    unused = set(sweep.runtime_options) - set(sweep.runtimes)
    if unused:
        raise UsageError(f"runtime_options.{sorted(unused)[0]} names a runtime not in the sweep")
    cells = sweep.cells()
    seen: set[str] = set()
    for cell in cells:
        raw = cell_params(cell)
        key = repr(sorted(raw.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            bench_cls().configure(raw)
    return SweepPlan(sweep=sweep, cells=cells, runtimes=runtimes)


def runtime_judge(sweep: Sweep, bench: Benchmark) -> Benchmark:
    """The instance whose `options` and `runtime_choice` judge the runtime axis: the benchmark
    as declared, or, when only its configuration takes a runtime (serve with live sessions:
    its agents' sandboxes), the cells' configured benchmark. Every cell then must take one,
    so that the runtime axis means the same in each."""
    if "runtime" in bench.options:
        return bench
    seen: set[str] = set()
    configured: list[Benchmark] = []
    for cell in sweep.cells():
        raw = cell_params(cell)
        key = repr(sorted(raw.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            each = type(bench)()
            try:
                each.configure(raw)
            except UsageError:  # said by `plan_sweep` in its order (an unknown name first)
                return bench
            configured.append(each)
    takers = [b for b in configured if "runtime" in b.options]
    if not takers:
        return bench
    if len(takers) < len(configured):
        raise UsageError(
            f"{sweep.benchmark} takes a runtime in only some of the sweep's cells; accepted: "
            "one sweep of the cells that take one (serve: --session-source live) and another "
            "of the rest"
        )
    return takers[0]


def _plan_runtimes(sweep: Sweep, bench: Benchmark) -> dict[str, RuntimeConfig | None]:
    """The config of each runtime axis value, checked against the benchmark and the machine.
    Without `--runtime`, a benchmark that needs one sweeps its default (named after it)."""
    if "runtime" not in bench.options:
        sweep.named_runtime = False
        if sweep.runtimes != [NO_RUNTIME]:
            raise UsageError(
                f"{sweep.benchmark} runs nothing in a sandbox, so it takes no --runtime"
            )
        return {NO_RUNTIME: None}
    default = bench.runtime_choice(None)
    if sweep.runtimes == [NO_RUNTIME] and not sweep.runtime_given and default is not None:
        sweep.runtimes = [default.type]
    runtimes: dict[str, RuntimeConfig | None] = {}
    for name in sweep.runtimes:
        config = runner.resolve_runtime(name, sweep.runtime_options.get(name, {}), NO_RUNTIME)
        if config is None and default is not None:
            raise UsageError(
                f"{sweep.benchmark} needs a runtime, so --runtime none does not apply; "
                f"its default is {default.type}"
            )
        runtimes[name] = bench.runtime_choice(config) if config is not None else None
    return runtimes


def cell_params(cell: Cell) -> dict[str, object]:
    """The benchmark parameters of one cell: its own, and the standard axes it sets."""
    raw = dict(cell.params)
    if cell.rollouts is not None:
        raw["rollouts"] = cell.rollouts
        raw["max_concurrent"] = cell.max_concurrent
    return raw


def _client_options(options: ClientOptions | None) -> dict[str, Any]:
    """`RunRequest`'s client_options keyword when the sweep was given one (else its default)."""
    return {} if options is None else {"client_options": options}


async def run_sweep(
    plan: SweepPlan,
    targets: Mapping[str, Target | None],
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

    `targets` maps tier name to its probed target (None: its cells call no model). The 2+2
    preflight runs once per tier, on its first cell, not once per cell: it checks the target,
    not the cell. With `resume`, a cell whose file says it completed is not run again (its
    file is returned as it is); any other cell runs afresh, replacing what its run directory
    held.
    """
    todo = list(plan.cells if cells is None else cells)
    checked: set[str] = set()
    results = []
    for i, cell in enumerate(todo, 1):
        done = _completed_cell(plan.sweep.out, cell) if resume else None
        if done is not None:
            if report is not None:
                kept = f"[{i}/{len(todo)}] {cell.name}  completed earlier: kept"
                print(safe_text(kept), file=report)
            results.append(done)
            continue
        target = targets[cell.tier.name]
        request = runner.RunRequest(
            benchmark=plan.sweep.benchmark,
            params=cell_params(cell),
            target=target,
            **_client_options(client_options),
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
    except UsageError as exc:
        logger.info("%s: unreadable (%s); the cell runs again", path, exc)
        return None
    return found if found.status == Status.COMPLETED else None


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
        target=request.target.base_url if request.target is not None else "",
        model=request.target.model if request.target is not None else "",
        started_at=datetime.now(UTC).isoformat(),
        run_dir=str(request.out),
    )
    try:
        outcome = await runner.run(request)
    except Exception as exc:  # the cell failed to run at all: record why and go on
        logger.debug("cell %s failed to run", cell.name, exc_info=exc)
        base.status, base.error = Status.FAILED, _one_line(exc)
        # e2e is the work phase as the benchmark clocked it; a run that raised never said it
        base.e2e_s = None
        assert request.out is not None
        return summarize(read_records(request.out / "rollouts.jsonl"), base)
    base.started_at = outcome.info.started_at
    base.params = {k: v for k, v in outcome.info.params.items() if k not in STANDARD_AXES}
    base.metrale_version = outcome.info.metrale_version
    if outcome.result.status != Status.COMPLETED:
        base.status, base.error = Status.FAILED, outcome.result.error or "run failed"
    if outcome.result.measured is not None:
        return base.with_summary(outcome.result.measured)
    assert request.out is not None
    return summarize(read_records(request.out / "rollouts.jsonl"), base)


def cell_line(cell: CellResult) -> str:
    """The line printed as each cell finishes; e2e is the summary's (the work phase)."""
    from metrale.fmt import duration_text, number_text, spread_unit

    total = Spread.of(cell.stage("total"))
    text = (
        f"{cell.cell}  e2e {duration_text(cell.e2e_s)}  err {cell.errors}/{cell.records}  "
        f"rew {number_text(cell.reward_mean)}"
    )
    if total.n:
        unit = spread_unit([total])
        text += f"  total {total.cell(unit)} {unit}"
    if cell.status == Status.FAILED:
        text += f"  FAILED: {cell.error}"
    return safe_text(text, lines=False)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__
