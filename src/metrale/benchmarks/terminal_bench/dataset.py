"""A dataset: a directory of Harbor task directories, run task by task, `attempts` times each.

`task=DIR` names one task when DIR holds a task.toml, else a dataset: every subdirectory (not
hidden) is a task, narrowed by `tasks=a,b` (names, each must exist) and `task_filter=GLOB`
(`fnmatch` on the name). A directory holding any of `TASK_MARKERS` is one task, so that a
task missing its task.toml says so. Rollout `i` is attempt `i % attempts` of task
`(i // attempts) mod tasks`.

A task that cannot run is skipped, not fatal: its directory is not a readable task (no
task.toml, a bad field: the reader's one line), or it asks for what no runtime here gives
(`task.refusals`), or the oracle is asked to run a task with no solution. Each is listed in
the per-task table with its reason, the others run; `strict=true` makes any of them a usage
error instead. A dataset where no task can run is a usage error.

`Tally` keeps, per task, what the per-task table shows (attempts, passes, rewards, errors by
type, stage durations) from the records as they end: O(tasks x attempts) numbers.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from metrale.benchmarks.terminal_bench.task import HarborTask, load_task, refusals, resolve_task_dir
from metrale.errors import UsageError
from metrale.plugin.per_task import TASK_STAGES, TaskSummary
from metrale.rollout import RolloutRecord
from metrale.stats import percentile


@dataclass
class Entry:
    """One task directory of the dataset: its task, or why it is skipped."""

    name: str
    path: Path
    task: HarborTask | None = None
    skipped: str | None = None


#: What makes a directory one task (even a broken one) rather than a directory of tasks.
TASK_MARKERS = ("task.toml", "instruction.md", "environment", "tests")


def is_dataset(spec: str) -> bool:
    """Whether `task=spec` names a directory of tasks rather than one task."""
    path = resolve_task_dir(spec)
    return not any((path / marker).exists() for marker in TASK_MARKERS)


def task_dirs(root: Path) -> list[Path]:
    """The candidate task directories of a dataset: subdirectories, not hidden, by name."""
    try:
        found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as exc:
        raise UsageError(f"cannot list the dataset {root}: {exc.strerror or exc}") from None
    return found


def select(dirs: list[Path], names: str, pattern: str, root: Path) -> list[Path]:
    """`tasks` (comma list of names, each must exist) and `task_filter` (a glob) applied."""
    chosen = dirs
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted:
        by_name = {p.name: p for p in dirs}
        missing = [n for n in wanted if n not in by_name]
        if missing:
            have = ", ".join(sorted(by_name)[:20]) + (" ..." if len(by_name) > 20 else "")
            raise UsageError(
                f"--tasks: {', '.join(missing)} not in the dataset {root}; its tasks: {have}"
            )
        chosen = [by_name[n] for n in dict.fromkeys(wanted)]
    if pattern.strip():
        chosen = [p for p in chosen if fnmatch.fnmatchcase(p.name, pattern.strip())]
        if not chosen:
            raise UsageError(
                f"--task-filter {pattern.strip()!r} matches no task of the dataset {root}"
            )
    return chosen


def load_dataset(
    spec: str, *, names: str = "", pattern: str = "", agent: str = "model", strict: bool = False
) -> list[Entry]:
    """Every chosen task of the dataset `spec`, each read (or skipped with its reason)."""
    root = resolve_task_dir(spec)
    dirs = select(task_dirs(root), names, pattern, root)
    if not dirs:
        raise UsageError(f"{root} holds no task.toml and no task directory; accepted: a Harbor "
                         "task directory, or a directory of them")  # fmt: skip
    entries = []
    for path in dirs:
        entry = Entry(name=path.name, path=path)
        try:
            entry.task = load_task(str(path))
        except UsageError as exc:
            entry.skipped = str(exc)
        if entry.task is not None:
            reasons = refusals(entry.task)
            if agent == "oracle" and not entry.task.has_solution:
                reasons.append(f"task {path.name}: solution/solve.sh is missing; agent=oracle "
                               "runs it")  # fmt: skip
            if reasons:
                entry.task, entry.skipped = None, "; ".join(reasons)
        entries.append(entry)
    skipped = [e for e in entries if e.skipped is not None]
    if strict and skipped:
        raise UsageError(f"--strict: {skipped[0].skipped} ({len(skipped)} of {len(entries)} "
                         "tasks cannot run)")  # fmt: skip
    if len(skipped) == len(entries):
        raise UsageError(f"no task of {root} can run; the first: {skipped[0].skipped}")
    return entries


@dataclass
class Tally:
    """Per task, what its finished attempts did (see the module docstring)."""

    attempts: int
    names: list[str]
    skipped: dict[str, str] = field(default_factory=dict)
    _passed: dict[str, dict[int, float]] = field(default_factory=dict)
    _rewards: dict[str, list[float]] = field(default_factory=dict)
    _errors: dict[str, dict[str, int]] = field(default_factory=dict)
    _stages: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, name: str, record: RolloutRecord) -> None:
        # as the declared `passed`: an agent timeout whose work passed the tests counts
        passed = record.reward is not None and record.reward >= 1.0
        self._passed.setdefault(name, {})[record.index] = 1.0 if passed else 0.0
        if record.reward is not None:
            self._rewards.setdefault(name, []).append(record.reward)
        if record.error is not None:
            errors = self._errors.setdefault(name, {})
            errors[record.error.type] = errors.get(record.error.type, 0) + 1
        stages = self._stages.setdefault(name, {})
        for stage in TASK_STAGES:
            if stage in record.stages:
                stages.setdefault(stage, []).append(record.stages[stage].duration_s)

    def summaries(self) -> list[TaskSummary]:
        out = []
        for name in self.names:
            passed = self._passed.get(name, {})
            stages = self._stages.get(name, {})
            p50 = {s: percentile(sorted(v), 50) for s, v in stages.items() if v}
            out.append(TaskSummary(
                name=name, attempts=len(passed), passed=[passed[i] for i in sorted(passed)],
                rewards=self._rewards.get(name, []), errors=self._errors.get(name, {}),
                stage_p50_s={s: x for s, x in p50.items() if x is not None},
                skipped=self.skipped.get(name),
            ))  # fmt: skip
        return out
