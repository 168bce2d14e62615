"""The per-cell results file: one JSON document per cell, replaced atomically and alone.

A cell file keeps the sorted per-rollout duration of every stage, not only percentiles, so that
`report`, `plot` and `compare` (which bootstraps) all work from the file with no run directory.
The same summary can be built from a run directory (`run.json` + `rollouts.jsonl`), which is how
`compare` accepts two plain `metrale run` outputs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from metrale import __version__
from metrale.errors import UsageError
from metrale.plugin import SCHEMA_VERSION, RunSummary, Status
from metrale.rundir import (
    installed_metrics,
    read_model,
    read_records,
    read_run_file,
    read_versioned,
    summarize_run_records,
)

if TYPE_CHECKING:
    from metrale.rollout import RolloutRecord

logger = logging.getLogger(__name__)


class CellResult(RunSummary):
    """What one cell measured: the cell's identity, and its run's `RunSummary` embedded (the
    same numbers result.json holds: `e2e_s`, `errors`, `reward_mean`, the sorted per-rollout
    `durations`, every declared metric and its sample). `rollouts` is None for a benchmark
    without a rollout count (serve); `max_concurrent` is absent from the file when
    unbounded."""

    cell: str
    benchmark: str
    tier: str | None = None
    runtime: str
    runtime_config: dict[str, Any] | None = None
    rollouts: int | None = None
    max_concurrent: int | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    target: str = ""
    model: str = ""
    metrale_version: str = __version__
    started_at: str = ""
    status: Status = Status.COMPLETED  # completed or failed: a cell file is final
    error: str | None = None
    run_dir: str | None = None

    def sample(self, name: str) -> list[Any]:
        """As `RunSummary.sample`; a cell file written before samples were kept still has
        the samples of the reward and the error rate, from its rewards and counts."""
        found = super().sample(name)
        if found or name in self.samples:
            return found
        if name == "reward_mean":
            return list(self.rewards)
        if name in ("error_rate", "errors"):
            return self.error_flags()
        return found

    def error_flags(self) -> list[float]:
        """One 0/1 per finished rollout (1 = failed): the sample behind the error rate."""
        return [1.0] * self.errors + [0.0] * max(self.records - self.errors, 0)

    def sort_key(self) -> tuple[Any, ...]:
        """Sweep order: tier, runtime, rollouts, then cap (unbounded first), then parameters."""
        conc = -1 if self.max_concurrent is None else self.max_concurrent
        return (self.tier or "", self.runtime, self.rollouts or 0, conc, self.cell)

    def with_summary(self, summary: RunSummary) -> CellResult:
        """This cell with `summary`'s numbers and declarations."""
        return self.model_copy(
            update={
                **summary.model_dump(),
                "declared": summary.declared,
                "per_task": summary.per_task,
            }
        )


def summarize(records: Sequence[RolloutRecord], cell: CellResult) -> CellResult:
    """Fill the numbers of `cell` from the records of its run (declared metrics included)."""
    where = f"{cell.run_dir}/rollouts.jsonl" if cell.run_dir else cell.cell
    return cell.with_summary(summarize_run_records(records, cell.benchmark, cell.e2e_s, where))


def with_declarations(cell: CellResult) -> CellResult:
    """A cell read from a file that stores no declarations (schema 1), with the ones its
    benchmark as installed today makes (what every reader used before files carried them)."""
    if not cell.declared:
        cell.declared = [m.declaration() for m in installed_metrics(cell.benchmark)]
    return cell


def write_cell(out_dir: Path, cell: CellResult) -> Path:
    """Write `<out_dir>/<cell>.json` by rename, so a reader never sees half a file and no other
    cell's file is touched."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{cell.cell}.json"
    data = cell.model_dump(mode="json")
    data["schema_version"] = SCHEMA_VERSION  # with declarations: read ones are filled in
    if data["max_concurrent"] is None:
        del data["max_concurrent"]
    tmp = out_dir / f".{cell.cell}.json.{os.getpid()}.tmp"
    try:
        text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        tmp.unlink(missing_ok=True)  # exclusive and no link followed: a sweep dir is data too
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(tmp, flags, 0o644), "w", encoding="utf-8") as f:
            f.write(text)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def read_cell(path: Path) -> CellResult:
    """A cell file; anything else is one line naming the file and the field."""
    form = "a metrale cell file (from 'metrale matrix')"
    return with_declarations(read_versioned(path, CellResult, "cell file", form=form))


def cell_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))


def is_cell_dir(directory: Path) -> bool:
    return directory.is_dir() and bool(cell_files(directory))


def is_run_dir(directory: Path) -> bool:
    return (directory / "run.json").is_file()


def read_cells(directory: Path) -> list[CellResult]:
    """Every cell file in `directory`, in sweep order."""
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    paths = cell_files(directory)
    if not paths:
        raise UsageError(f"{directory} holds no cell files (*.json from 'metrale matrix')")
    return sorted((read_cell(p) for p in paths), key=CellResult.sort_key)


class _StoredOutcome(BaseModel):
    status: str | None = None
    error: str | None = None
    metrics: dict[str, float | int | None] = Field(default_factory=dict)


class _StoredResult(BaseModel):
    """The part of `result.json` a report reads, typed: a wrong type is named, not ignored."""

    result: _StoredOutcome = Field(default_factory=_StoredOutcome)


def cell_from_run_dir(run_dir: Path) -> CellResult:
    """A cell summary of a plain run directory, named after the directory: the summary its
    result.json holds, else (a run that never finished) one made from its records. Every file
    is read typed and bounded (`rundir.read_model`): a malformed one is one line naming it."""
    if not (run_dir / "run.json").exists():
        raise UsageError(f"{run_dir} is not a run directory (no run.json)")
    info = read_run_file(run_dir)
    params = info.params
    runtime = info.runtime
    rollouts = params.get("rollouts")
    max_concurrent = params.get("max_concurrent")
    if max_concurrent is not None and (
        not isinstance(max_concurrent, int) or isinstance(max_concurrent, bool)
    ):
        raise UsageError(
            f"run file {run_dir / 'run.json'}: field params.max_concurrent: "
            "accepted: an integer or null"
        )
    runtime_type = runtime.get("type", "?") if runtime is not None else "none"
    cell = CellResult(
        cell=run_dir.name,
        benchmark=info.benchmark,
        runtime=str(runtime_type),
        runtime_config=runtime,
        rollouts=rollouts if isinstance(rollouts, int) else None,
        max_concurrent=max_concurrent,
        params={k: v for k, v in params.items() if k not in ("rollouts", "max_concurrent")},
        target=info.target,
        model=info.model,
        metrale_version=info.metrale_version,
        started_at=info.started_at,
        run_dir=str(run_dir),
    )
    result_path = run_dir / "result.json"
    if result_path.exists() or result_path.is_symlink():
        result = read_model(result_path, _StoredResult, "result file").result
        if result.status == Status.FAILED:
            cell.status, cell.error = Status.FAILED, result.error
        e2e = result.metrics.get("e2e_s")  # the work, not the wall
        cell.e2e_s = None if e2e is None else float(e2e)
        summary = run_dir / "summary.json"
        if summary.exists() or summary.is_symlink():
            found = read_versioned(summary, RunSummary, "summary file")
            return with_declarations(cell.with_summary(found))
    return summarize(read_records(run_dir / "rollouts.jsonl"), cell)
