"""A run over a dataset, task by task: what each task's attempts scored, and the dataset's
numbers built from them (pass@1, pass@k, tasks solved).

A benchmark that runs several tasks, each several times (terminal_bench over a directory of
tasks, `--attempts K`), puts one `TaskSummary` per task in `RunSummary.per_task`; a task it
skipped (refused, unreadable) is there too, with its reason and no attempts. The run's table,
`report`, `compare`, the HTML page and a matrix cell read it from the file, so a sweep over a
dataset keeps its breakdown. Definitions, once:

- **pass@1** of a task: c / n, its passed attempts over its attempts (an attempt that failed
  with an error has not passed);
- **pass@k**: the unbiased estimator 1 - C(n-c, k) / C(n, k) (`metrale.stats.pass_at_k`),
  with k the run's attempts per task;
- a dataset's pass@1 and pass@k: the mean over the tasks that ran (skipped tasks are not in
  it: their count is beside it); **solved**: tasks with at least one passed attempt.

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from metrale.fmt import duration_text, number_text
from metrale.stats import mean, pass_at_k

#: The stages whose p50 the per-task table shows.
TASK_STAGES: tuple[str, ...] = ("setup", "generation", "scoring")


class TaskSummary(BaseModel):
    """One task of a dataset run."""

    name: str
    #: attempts that ran (a record each), and 0/1 per attempt in index order: 1 = reward >= 1
    attempts: int = 0
    passed: list[float] = Field(default_factory=list)
    #: the reward of each attempt that has one
    rewards: list[float] = Field(default_factory=list)
    #: failed attempts by error type (`image_build`, `agent_timeout`, ...)
    errors: dict[str, int] = Field(default_factory=dict)
    #: p50 seconds of each stage over the attempts
    stage_p50_s: dict[str, float] = Field(default_factory=dict)
    #: why the task did not run (refused, unreadable), or None
    skipped: str | None = None

    @property
    def solved(self) -> bool:
        return any(self.passed)

    def pass_at(self, k: int) -> float | None:
        return pass_at_k(len(self.passed), int(sum(self.passed)), k) if self.passed else None

    @property
    def reward_mean(self) -> float | None:
        return mean(self.rewards)


def ran(tasks: Sequence[TaskSummary]) -> list[TaskSummary]:
    return [t for t in tasks if t.skipped is None and t.passed]


def dataset_pass_at(tasks: Sequence[TaskSummary], k: int) -> float | None:
    """Mean over the tasks that ran of their pass@k (None when none has k attempts)."""
    values = [t.pass_at(k) for t in ran(tasks)]
    found = [v for v in values if v is not None]
    return mean(found) if found and len(found) == len(values) else None


def dataset_numbers(tasks: Sequence[TaskSummary], k: int) -> dict[str, float | int | None]:
    """The dataset's summary numbers (RunSummary.metrics): tasks, ran, skipped, solved,
    pass_at_1, pass_at_k (k = `attempts`)."""
    done = ran(tasks)
    return {
        "tasks": len(tasks),
        "tasks_skipped": sum(1 for t in tasks if t.skipped is not None),
        "tasks_solved": sum(1 for t in done if t.solved),
        "attempts": k,
        "pass_at_1": dataset_pass_at(tasks, 1),
        "pass_at_k": dataset_pass_at(tasks, k),
    }


def per_task_table(tasks: Sequence[TaskSummary], k: int) -> tuple[list[str], list[list[str]]]:
    """Headers and text rows: one row per task, skipped tasks with their reason."""
    columns = ["task", "attempts", "reward", "pass@1", f"pass@{k}", "errors"]
    columns += [f"{s} p50" for s in TASK_STAGES] + ["skipped"]
    rows = []
    for t in tasks:
        errors = ", ".join(f"{kind} x{n}" for kind, n in sorted(t.errors.items())) or "-"
        rows.append([
            t.name, str(t.attempts), number_text(t.reward_mean), number_text(t.pass_at(1)),
            number_text(t.pass_at(k)), errors if t.skipped is None else "-",
            *(duration_text(t.stage_p50_s.get(s)) for s in TASK_STAGES),
            t.skipped or "",
        ])  # fmt: skip
    return columns, rows


def dataset_line(tasks: Sequence[TaskSummary], k: int) -> str:
    """The dataset's summary in one line."""
    n = dataset_numbers(tasks, k)
    errors = sum(sum(t.errors.values()) for t in tasks)
    rewards = [r for t in ran(tasks) for r in t.rewards]
    return (
        f"dataset: {n['tasks']} tasks ({n['tasks_skipped']} skipped) x {k} attempts · "
        f"reward {number_text(mean(rewards))} · pass@1 {number_text(n['pass_at_1'])} · "
        f"pass@{k} {number_text(n['pass_at_k'])} · solved {n['tasks_solved']} · "
        f"{errors} errors"
    )
