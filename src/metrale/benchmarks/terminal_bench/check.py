"""`metrale tasks check`: whether tasks will run, without running them.

For each task directory (a task, or every task of a dataset): the layout and task.toml as the
run reads them (`task.load_task`: the same one line per problem), the fields a run refuses
(`task.refusals`: `gpus > 0`, `mcp_servers`), and where each `FROM` image comes from
(`build_policy.local_base`: the user's `--base-image`, the default mapping, or with `engine`
the images the engine holds). An absent `solution/solve.sh` is a note, not a problem: only
`agent=oracle` needs it. Nothing is built and no container starts; the engine is asked once,
for its image names, only when `engine` is given.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metrale.benchmarks.terminal_bench.build_policy import DEFAULT_BASES, local_base
from metrale.benchmarks.terminal_bench.dataset import TASK_MARKERS, task_dirs
from metrale.benchmarks.terminal_bench.images import BASE_IMAGE_OPTION
from metrale.benchmarks.terminal_bench.task import HarborTask, load_task, refusals
from metrale.errors import UsageError

#: How long the engine may take to list its images.
ENGINE_TIMEOUT_S = 60.0


@dataclass
class TaskCheck:
    """One task directory: its problems (each one line) and notes."""

    name: str
    path: Path
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return not self.problems


@dataclass
class CheckReport:
    tasks: list[TaskCheck] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when every task is runnable, 1 when some are not."""
        return 0 if all(t.runnable for t in self.tasks) else 1

    def lines(self) -> Iterator[str]:
        for t in self.tasks:
            yield from (f"{t.name}: {p}" for p in t.problems)
        for t in self.tasks:
            yield from (f"{t.name}: note: {n}" for n in t.notes)
        bad = [t for t in self.tasks if not t.runnable]
        problems = sum(len(t.problems) for t in bad)
        no_oracle = sum(1 for t in self.tasks if any("solve.sh" in n for n in t.notes))
        yield (
            f"{len(self.tasks)} tasks: {len(self.tasks) - len(bad)} runnable, {len(bad)} not "
            f"({problems} problems); {no_oracle} without an oracle solution"
        )


def task_paths(roots: Sequence[Path]) -> list[Path]:
    """Each root as one task (it holds a task marker), or its task directories; a root that is
    not a directory is a UsageError."""
    found: list[Path] = []
    for root in roots:
        if not root.is_dir():
            raise UsageError(f"{root} is not a directory; accepted: a task directory or a "
                             "directory of them")  # fmt: skip
        if any((root / marker).exists() for marker in TASK_MARKERS):
            found.append(root)
        else:
            found += task_dirs(root)
    return found


def engine_images(cli: str) -> set[str]:
    """Every name the engine holds (`repo:tag`, also without a `localhost/` prefix)."""
    argv = [cli, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--engine: cannot list the images of {cli!r}: {exc}") from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise UsageError(f"--engine: {cli} image ls failed: {why[0]}")
    names = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    return names | {n.removeprefix("localhost/") for n in names}


def check_task(path: Path, mapping: Mapping[str, str], present: set[str] | None) -> TaskCheck:
    """The problems and notes of one task directory."""
    result = TaskCheck(name=path.name, path=path)
    try:
        task = load_task(str(path))
    except UsageError as exc:
        result.problems.append(str(exc))
        return result
    result.problems += refusals(task)
    result.problems += _bases(task, mapping, present)
    if not task.has_solution:
        result.notes.append("no solution/solve.sh: agent=oracle cannot run it")
    return result


def _bases(task: HarborTask, mapping: Mapping[str, str], present: set[str] | None) -> list[str]:
    names = [task.environment.docker_image] if task.environment.docker_image else []
    if not names and task.dockerfile is not None:
        names = list(dict.fromkeys(task.dockerfile.bases))
    problems = []
    for name in names:
        local = local_base(name, mapping)
        mapped = local != name or name in DEFAULT_BASES
        if present is None:
            if not mapped:
                problems.append(
                    f"FROM {name}: not mapped to a local image and metrale never pulls; map "
                    f"it with {BASE_IMAGE_OPTION}, or check with --engine that it is present"
                )
        elif local not in present and _short(local) not in present:
            via = f" (mapped to {local})" if local != name else ""
            problems.append(f"FROM {name}{via}: not present in the engine and metrale never "
                            f"pulls; map it with {BASE_IMAGE_OPTION}")  # fmt: skip
    return problems


def _short(name: str) -> str:
    """`name` with the `:latest` an engine lists for an untagged name."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def check_paths(
    roots: Sequence[Path], mapping: Mapping[str, str], *, engine: str | None = None
) -> CheckReport:
    """Every task under `roots`, checked (see the module docstring)."""
    paths = task_paths(roots)
    if not paths:
        raise UsageError(f"no task directory under {', '.join(map(str, roots))}")
    present = engine_images(engine) if engine else None
    return CheckReport([check_task(p, mapping, present) for p in paths])
