"""Everything terminal_bench does once per run, before any rollout: its parameters, the runtime
check, reading the task (or the dataset's tasks, `dataset.py`), building (or reusing) their
images and, for bwrap, exporting their roots.

The image builds are timed and logged here, apart from every rollout's setup: once per distinct
environment (tasks whose environment directories and base images are the same share one
image), `build_concurrency` at a time. A build that fails does not stop the run: it is kept on
the task's `TaskRun`, and each of its rollouts records it as its error (`image_build`), so a
matrix over many cells shows the failure in each cell's errors. A single task or base image
that is wrong is the user's mistake: `UsageError`, before any work; in a dataset, a task whose
base image is absent fails its build, and the others run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

from metrale.agent import DEFAULT_SYSTEM_PROMPT, AgentConfig
from metrale.benchmarks.terminal_bench.agents import AGENTS
from metrale.benchmarks.terminal_bench.build_policy import policy
from metrale.benchmarks.terminal_bench.dataset import Entry, is_dataset, load_dataset
from metrale.benchmarks.terminal_bench.images import (
    ImageBuildError,
    TaskImage,
    check_bases,
    context_hash,
    ensure_image,
    export_rootfs,
    parse_base_images,
)
from metrale.benchmarks.terminal_bench.rollout import TaskRun
from metrale.benchmarks.terminal_bench.task import (
    HarborTask,
    load_task,
    network_refusal,
    refusals,
)
from metrale.errors import UsageError
from metrale.plugin import ParamSpec
from metrale.runtime.base import Capability, RuntimeConfig
from metrale.runtime.configs import check_runtime as check_machine
from metrale.runtime.configs import runtime_config

#: What a runtime must provide for a task: its image's file system, root inside it.
NEEDS = frozenset({Capability.TASK_IMAGE})
RUNTIME_REASON = "a task needs its own container image's file system and root inside it"


def extra_parameters() -> list[ParamSpec]:
    return [
        ParamSpec(name="task", type="str", default="fix-git",
                  help="a Harbor task directory, a directory of them (a dataset), or a task "
                  "shipped with metrale (fix-git, fix-money, log-summary)"),
        ParamSpec(name="tasks", type="str", default="",
                  help="a dataset's tasks to run, by name (a comma list; default: all)"),
        ParamSpec(name="task_filter", type="str", default="",
                  help="a dataset's tasks whose name matches this glob (e.g. 'fix-*')"),
        ParamSpec(name="attempts", type="int", default=None, min=1, max=100_000,
                  nullable=True,
                  help="attempts per task, each a rollout in a fresh sandbox (default: 1 for "
                  "a dataset; --rollouts for one task); a dataset runs tasks x attempts"),
        ParamSpec(name="strict", type="bool", default=False,
                  help="a dataset task that cannot run (refused, unreadable) stops the run "
                  "instead of being skipped with its reason"),
        ParamSpec(name="build_network", type="bool", default=True,
                  help="image builds may reach what the machine reaches (package registries); "
                  "--no-build-network builds offline. Rollouts follow allow_internet"),
        ParamSpec(name="build_ca", type="bool", default=True,
                  help="offer the host's CA bundle to builds' RUN steps (pip, curl behind a "
                  "proxy the host trusts); --no-build-ca does not"),
        ParamSpec(name="build_concurrency", type="int", default=None, min=1, max=64,
                  nullable=True,
                  help="image builds at once (default: half the CPUs, 1 to 4)"),
        ParamSpec(name="agent", type="str", default="model", choices=list(AGENTS),
                  help="model: the shell agent loop on the target; oracle: the task's "
                  "solution/solve.sh, no model; nop: does nothing (its score must be 0)"),
        ParamSpec(name="max_turns", type="int", default=32, min=1, max=10_000,
                  help="the model agent's turn cap"),
        ParamSpec(name="command_timeout_s", type="float", default=120.0, min=0.1,
                  help="the model agent's limit per command"),
        ParamSpec(name="agent_timeout_s", type="float", default=None, min=0.1, nullable=True,
                  help="the agent's whole time (default: task.toml [agent] timeout_sec)"),
        ParamSpec(name="verifier_timeout_s", type="float", default=None, min=0.1,
                  nullable=True,
                  help="test.sh's time (default: task.toml [verifier] timeout_sec)"),
        ParamSpec(name="build_timeout_s", type="float", default=None, min=1, nullable=True,
                  help="the image build's time (default: task.toml build_timeout_sec)"),
        ParamSpec(name="base_image", type="str", default="",
                  help="NAME=LOCAL[,NAME=LOCAL...]: build FROM NAME on the local image LOCAL "
                  "(--base-image, once for the run or dataset; NAME may be a glob; "
                  "debian:bookworm and the public Terminal-Bench bases map to "
                  "metrale/base:bookworm by default)"),
    ]  # fmt: skip


def _accepted() -> str:
    from metrale.runtime.registry import config_classes

    return ", ".join(n for n, c in config_classes().items() if c.capabilities >= NEEDS)


def check_runtime(config: RuntimeConfig | None) -> None:
    """UsageError for a runtime a task cannot run in, naming why and what is accepted."""
    if config is None:
        raise UsageError(f"terminal_bench needs a runtime; accepted: {_accepted()}")
    inner = getattr(config, "inner", None)
    if config.lacks(NEEDS):
        what = f"{config.type} over {inner.type}" if inner is not None else config.type
        raise UsageError(
            f"terminal_bench does not run under --runtime {what}: {RUNTIME_REASON}, and "
            f"{what} cannot provide one; accepted: {_accepted()}"
        )
    image_field = type(config if inner is None else inner).model_fields.get("image")
    chosen = getattr(config if inner is None else inner, "image", None)
    if image_field is not None and chosen != image_field.default:
        raise UsageError(
            f"terminal_bench runs each task in the image built from its own Dockerfile, so "
            f"--image {chosen} does not apply; accepted: --base-image NAME=LOCAL to build "
            "a task's FROM image on a local one"
        )


def engine_cli(config: RuntimeConfig) -> str:
    """The container CLI that builds images: the runtime's own where it has one, else
    `docker`."""
    inner = getattr(config, "inner", config)
    cli = getattr(inner, "cli", None)
    return cli if isinstance(cli, str) else "docker"


def task_run(values: Mapping[str, Any], *, max_tokens: int | None = 4096) -> TaskRun:
    """Read the task (UsageError when it is broken) and fix the run's limits."""
    task = load_task(str(values["task"]))
    if values["agent"] == "oracle" and not task.has_solution:
        raise UsageError(f"task {task.path}: solution/solve.sh is missing; agent=oracle runs it")
    reasons = refusals(task)
    if reasons:
        raise UsageError(reasons[0])
    return run_of(task, values, max_tokens=max_tokens)


def task_runs(
    values: Mapping[str, Any], *, max_tokens: int | None = 4096
) -> tuple[list[Entry], list[TaskRun]]:
    """Every task the run names (one, or a dataset's) and the runs of those that can run."""
    spec = str(values["task"])
    if not is_dataset(spec):
        if values.get("tasks") or values.get("task_filter"):
            raise UsageError(f"--tasks and --task-filter choose within a dataset; {spec} is "
                             "one task (a directory with task.toml)")  # fmt: skip
        run = task_run(values, max_tokens=max_tokens)
        return [Entry(name=run.task.name, path=run.task.path, task=run.task)], [run]
    entries = load_dataset(
        spec, names=str(values.get("tasks") or ""), pattern=str(values.get("task_filter") or ""),
        agent=str(values["agent"]), strict=bool(values.get("strict")),
    )  # fmt: skip
    runs = [run_of(e.task, values, max_tokens=max_tokens) for e in entries if e.task is not None]
    return entries, runs


def run_of(task: HarborTask, values: Mapping[str, Any], *, max_tokens: int | None) -> TaskRun:
    return TaskRun(
        task=task,
        agent=str(values["agent"]),
        agent_timeout_s=float(values.get("agent_timeout_s") or task.agent_timeout_s),
        verifier_timeout_s=float(values.get("verifier_timeout_s") or task.verifier_timeout_s),
        agent_config=AgentConfig(
            max_turns=int(values["max_turns"]),
            command_timeout_s=float(values["command_timeout_s"]),
            max_tokens=max_tokens,
            system_prompt=DEFAULT_SYSTEM_PROMPT,
        ),
    )


def check_engine(runs: list[TaskRun], values: Mapping[str, Any], config: RuntimeConfig) -> None:
    """Blocking, before any work: the engine that builds images answers, and for one task every
    base image is present locally (each a UsageError naming what is missing and the fix; in a
    dataset an absent base fails that task's build only)."""
    cli = engine_cli(config)
    inner = getattr(config, "inner", config)
    # the image builder's engine: the docker runtime's own check probes it, once per run
    engine = inner if inner.type == "docker" else runtime_config("docker", cli=cli)
    check_machine(engine)
    mapping = parse_base_images(values.get("base_image"))
    if len(runs) == 1 and not is_dataset(str(values["task"])):
        check_bases(runs[0].task, cli, mapping)


def refuse_by_network(
    entries: list[Entry], runs: list[TaskRun], values: Mapping[str, Any], config: RuntimeConfig
) -> list[TaskRun]:
    """The runs whose `allow_internet` the runtime can follow exactly. One task it cannot is a
    UsageError, and so is a dataset's under `strict`; else that task is skipped with its reason
    (on `entries`), and a dataset left with no task is a UsageError."""
    inner = getattr(config, "inner", None)
    what = f"{config.type} over {inner.type}" if inner is not None else config.type
    cuts = not config.lacks(frozenset({Capability.NETWORK_OFF}))
    gives = not config.lacks(frozenset({Capability.NETWORK}))
    refused = {}
    for run in runs:
        reason = network_refusal(run.task, what, cuts=cuts, gives=gives)
        if reason is not None:
            refused[run.task.name] = reason
    if not refused:
        return runs
    first = next(iter(refused.values()))
    if not is_dataset(str(values["task"])):
        raise UsageError(first)
    if values.get("strict"):
        raise UsageError(f"--strict: {first} ({len(refused)} of {len(entries)} tasks cannot "
                         "run)")  # fmt: skip
    for entry in entries:
        if entry.name in refused:
            entry.task, entry.skipped = None, refused[entry.name]
    kept = [run for run in runs if run.task.name not in refused]
    if not kept:
        raise UsageError(f"no task of {values['task']} can run on {what}; the first: {first}")
    return kept


def build_concurrency(values: Mapping[str, Any]) -> int:
    """Builds at once: the parameter, else half the CPUs, at least 1 and at most 4 (a build
    is CPU- and disk-bound, and the engine is shared with the rollouts)."""
    given = values.get("build_concurrency")
    return int(given) if given else max(1, min(4, (os.cpu_count() or 2) // 2))


async def build_all(
    runs: list[TaskRun],
    values: Mapping[str, Any],
    config: RuntimeConfig,
    log: Callable[[str, Literal["info", "warn", "error"]], None],
) -> None:
    """Each distinct environment's image once, `build_concurrency` at a time, onto every run
    that shares it (a failure too)."""
    groups: dict[str, list[TaskRun]] = {}
    for run in runs:
        key = await asyncio.to_thread(_environment_key, run.task)
        groups.setdefault(key, []).append(run)
    gate = asyncio.Semaphore(build_concurrency(values))

    async def one(group: list[TaskRun]) -> None:
        async with gate:
            await build(group[0], values, config, log)
        for other in group[1:]:
            other.image, other.build_error = group[0].image, group[0].build_error

    await asyncio.gather(*(one(group) for group in groups.values()))


def _environment_key(task: HarborTask) -> str:
    """What makes two tasks' images the same: the environment directory's files and the base
    images named (their ids are checked by the build's own hash)."""
    bases = task.dockerfile.bases if task.dockerfile else ()
    return f"{context_hash(task, {})} {task.environment.docker_image} {' '.join(bases)}"


async def build(
    run: TaskRun,
    values: Mapping[str, Any],
    config: RuntimeConfig,
    log: Callable[[str, Literal["info", "warn", "error"]], None],
) -> None:
    """The task's image (and for bwrap its exported root) onto `run`; a failed build is kept
    on `run.build_error`. Absent base images raise UsageError (nothing has started yet)."""
    cli = engine_cli(config)
    mapping = parse_base_images(values.get("base_image"))
    timeout = float(values.get("build_timeout_s") or run.task.environment.build_timeout_s)
    image: TaskImage | None = None
    try:
        image = await ensure_image(
            run.task, cli, mapping, build_timeout_s=timeout, policy=policy(values)
        )
    except UsageError as exc:  # an absent base image of a dataset's task: its build fails
        if not is_dataset(str(values["task"])):
            raise
        run.build_error = ImageBuildError(str(exc))
    except ImageBuildError as exc:
        run.build_error = exc
    if image is None:
        log(f"task {run.task.name}: image build failed; its rollouts record it: "
            f"{run.build_error}", "error")  # fmt: skip
        return
    run.image = image
    how = "reused (cached)" if image.cached else f"built in {image.build_s:.2f} s"
    log(f"task {run.task.name}: image {image.tag} {how}", "info")
    if config.image_form() == "rootfs":
        try:
            root = await export_rootfs(image, cli)
        except ImageBuildError as exc:
            run.build_error = exc
            log(f"exporting the image's root failed; every rollout records it: {exc}", "error")
            return
        log(f"image root at {root} ({image.export_s:.2f} s)", "info")
