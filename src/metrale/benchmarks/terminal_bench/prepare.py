"""Everything terminal_bench does once per run, before any rollout: its parameters, the runtime
check, reading the task, building (or reusing) its image and, for bwrap, exporting its root.

The image build is timed and logged here, apart from every rollout's setup. A build that fails
does not stop the run: it is kept on the `TaskRun`, and every rollout records it as its error
(`image_build`), so a matrix over many cells shows the failure in each cell's errors. A task or
base image that is wrong is the user's mistake: `UsageError`, before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from metrale.agent import DEFAULT_SYSTEM_PROMPT, AgentConfig
from metrale.benchmarks.terminal_bench.agents import AGENTS
from metrale.benchmarks.terminal_bench.images import (
    ImageBuildError,
    check_bases,
    ensure_image,
    export_rootfs,
    parse_base_images,
)
from metrale.benchmarks.terminal_bench.rollout import TaskRun
from metrale.benchmarks.terminal_bench.task import load_task
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
                  help="a Harbor task directory, or a task shipped with metrale "
                  "(fix-git, fix-money, log-summary)"),
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
                  "(--base-image; debian:bookworm is metrale's base image already)"),
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


def check_engine(run: TaskRun, values: Mapping[str, Any], config: RuntimeConfig) -> None:
    """Blocking, before any work: the engine that builds images answers, and every base image
    of the task is present locally (each a UsageError naming what is missing and the fix)."""
    cli = engine_cli(config)
    inner = getattr(config, "inner", config)
    # the image builder's engine: the docker runtime's own check probes it, once per run
    engine = inner if inner.type == "docker" else runtime_config("docker", cli=cli)
    check_machine(engine)
    check_bases(run.task, cli, parse_base_images(values.get("base_image")))


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
    try:
        image = await ensure_image(run.task, cli, mapping, build_timeout_s=timeout)
    except ImageBuildError as exc:
        run.build_error = exc
        log(f"image build failed; every rollout records it: {exc}", "error")
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
