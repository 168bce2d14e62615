"""Drive one benchmark from parameters to a final result, and keep its run directory.

The run directory (`runs/<UTC timestamp>-<benchmark>/` or `--out`) holds `run.json` (parameters,
target, model, metrale version, preflight), `rollouts.jsonl` (appended and flushed as each
rollout ends) and `result.json` (the final snapshot: metrics, stage summaries, verdict), written
last and atomically. The runner feeds the live view (`metrale.live`) every event; it knows
nothing of what a benchmark measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import sys
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, Field

from metrale import __version__, rundir
from metrale.budgets import check_budget_metrics
from metrale.endpoint.client import ClientOptions, Target
from metrale.endpoint.probe import Preflight, preflight
from metrale.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_VERDICT_FAILED,
    MetraleError,
    RecordWriteError,
    UsageError,
)
from metrale.live import View, make_view
from metrale.plugin import (
    Benchmark,
    BenchmarkResult,
    LogLine,
    PluginHandle,
    Status,
    canonical_id,
    check_bounds,
    get_benchmark,
)
from metrale.rollout import finish
from metrale.rundir import ResumeRecords, RunArtifacts
from metrale.runtime.base import RuntimeConfig
from metrale.telemetry import merge as merge_telemetry
from metrale.telemetry import sampling

logger = logging.getLogger(__name__)


class RunInfo(BaseModel):
    """What was run, against what, by which metrale: written before the first rollout."""

    benchmark: str
    params: dict[str, Any]
    target: str
    model: str
    embedded: bool = False
    runtime: dict[str, Any] | None = None
    client: dict[str, Any] = Field(default_factory=dict)
    budgets: dict[str, float] = Field(default_factory=dict)
    metrale_version: str = __version__
    python: str = platform.python_version()
    host: str = platform.node()
    started_at: str
    preflight: Preflight | None = None


class RunResult(BaseModel):
    """`result.json`. `wall_s` is the whole run (load, preflight, the work, cleanup); the e2e
    that run, matrix and report print is the work alone: `result.metrics["e2e_s"]`
    (`RunSummary.e2e_s`)."""

    info: RunInfo
    run_dir: str
    result: BenchmarkResult
    wall_s: float
    exit_code: int


@dataclass
class RunRequest:
    benchmark: str
    params: Mapping[str, object]
    #: None when the benchmark, so configured, calls no model (`Benchmark.needs_model`)
    target: Target | None
    client_options: ClientOptions = field(default_factory=ClientOptions)
    runtime: RuntimeConfig | None = None
    runtime_retries: int = 0
    out: Path | None = None
    #: `out` is an earlier run's directory to finish (`metrale run --resume`)
    resume: bool = False
    #: with `resume`: run the failed rollouts again too
    retry_errors: bool = False
    #: a new run may replace the records of an earlier one in `out`
    overwrite: bool = False
    runs_dir: Path = Path("runs")
    budgets: Mapping[str, float] = field(default_factory=dict)
    preflight: bool = True
    progress: TextIO | None = field(default_factory=lambda: sys.stderr)


def prepare(request: RunRequest) -> tuple[Benchmark, dict[str, Any]]:
    """Find and configure the benchmark: every usage error surfaces here, before any work.

    The runtime the benchmark will use replaces `request.runtime` (its default filled in, one
    it cannot use refused), so that run.json records the runtime that is used.
    """
    request.benchmark = canonical_id(request.benchmark)
    bench = get_benchmark(request.benchmark)()
    values = bench.configure(dict(request.params))
    request.runtime = bench.runtime_choice(request.runtime)
    check_bounds({}, request.budgets)
    check_budget_metrics(request.budgets, bench.metrics(), request.benchmark)
    return bench, dict(values)


def check_run_dir(request: RunRequest) -> None:
    """Before a target starts: is the run directory one this run may write (or resume)?"""
    if request.out is None:
        return
    if request.resume:
        rundir.read_run_info(request.out)
    else:
        rundir.check_new(request.out, overwrite=request.overwrite)


def new_run_dir(request: RunRequest) -> Path:
    """The run directory: resumed as it is, or new (an earlier run's is refused, see `rundir`)."""
    if request.out is not None:
        path = request.out
    else:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = request.runs_dir / f"{stamp}-{request.benchmark}"
    if request.resume:
        return path
    return rundir.create_new(path, overwrite=request.overwrite)


def _resume(
    request: RunRequest, bench: Benchmark, values: dict[str, Any], path: Path
) -> ResumeRecords:
    if not getattr(bench, "resumable", False):
        raise UsageError(f"benchmark {request.benchmark} cannot resume a run directory")
    scan = rundir.prepare_resume(path, int(values["rollouts"]), retry_errors=request.retry_errors)
    kept = ResumeRecords(path=path / "rollouts.jsonl", indices=scan.kept)
    _check_samples(kept, bench)
    return kept


def _check_samples(kept: ResumeRecords, bench: Benchmark) -> None:
    """Every kept record yields a number for each declared metric: the file may come from
    anyone, and a string where a number belongs would otherwise end the run half-way."""
    from metrale.errors import data_lines
    from metrale.rollout import RolloutRecord

    metrics = [m for m in bench.metrics() if m.value is not None]
    if not metrics:
        return
    for line in data_lines(kept.path, "rollout records"):
        if not line.strip():
            continue
        record = RolloutRecord.model_validate_json(line)  # `prepare_resume` read each as one
        if record.index not in kept.indices:
            continue
        for metric in metrics:
            try:
                metric.sample_of(record)
            except (TypeError, ValueError):
                raise UsageError(
                    f"rollout records {kept.path}: record {record.index}: metric "
                    f"{metric.name} is not a number; accepted: a number or null"
                ) from None


async def run(request: RunRequest) -> RunResult:
    """Run one benchmark end to end; the returned result is also in `<run_dir>/result.json`.

    The run directory is made (or checked, or resumed) and `rollouts.jsonl` opened before any
    work, so a run that could not keep its records never starts.
    """
    bench, values = prepare(request)
    display = make_view(request.progress)
    run_dir = new_run_dir(request)
    resume = _resume(request, bench, values, run_dir) if request.resume else None
    artifacts = RunArtifacts(run_dir)
    try:
        artifacts.open("rollouts.jsonl")
    except RecordWriteError as exc:
        raise UsageError(str(exc)) from None
    try:
        return await _run_in(request, bench, values, display, artifacts, resume)
    finally:
        artifacts.close()


async def _run_in(
    request: RunRequest,
    bench: Benchmark,
    values: dict[str, Any],
    display: View,
    artifacts: RunArtifacts,
    resume: ResumeRecords | None,
) -> RunResult:
    target = request.target
    preflight_task: asyncio.Task[Preflight] | None = None
    if request.preflight and target is not None and bench.needs_model():
        # Off the critical path: the 2+2 question runs beside the benchmark's load and its
        # first rollouts (a target answering in 5 s no longer delays them by 10 s); run.json
        # gets its answer when it comes.
        preflight_task = asyncio.ensure_future(preflight(target, request.client_options))
    info = RunInfo(
        benchmark=request.benchmark,
        params=values,
        target=target.base_url if target is not None else "",
        model=target.model if target is not None else "",
        embedded=target.embedded if target is not None else False,
        runtime=request.runtime.model_dump() if request.runtime else None,
        client=request.client_options.model_dump(),
        budgets=dict(request.budgets),
        started_at=datetime.now(UTC).isoformat(),
    )
    if resume is None:
        artifacts.write_json("run.json", info)
    if preflight_task is not None:
        preflight_task.add_done_callback(
            lambda task: _preflight_done(task, info, display, artifacts, resume is None)
        )
    interrupted = asyncio.Event()  # set when Ctrl-C or SIGTERM reaches the run, before cleanup
    handle = PluginHandle(
        target=request.target,
        artifacts=artifacts,
        client_options=request.client_options,
        runtime=request.runtime,
        runtime_retries=request.runtime_retries,
        on_status=display.phase,
        on_progress=display.progress,
        cancelled=interrupted.is_set,
        resume=resume,
    )
    started = time.perf_counter()
    final = BenchmarkResult(status=Status.FAILED, error="run did not start")
    seen_logs = 0
    notes: list[LogLine] = []
    telemetry = contextlib.AsyncExitStack()
    if target is not None and bench.needs_model():

        def note(text: str) -> None:
            notes.append(LogLine(level="info", message=text))
            display.log(notes[-1])

        in_flight = getattr(bench, "in_flight", None)
        handle.telemetry = await telemetry.enter_async_context(sampling(
            target, artifacts, origin=started, on_note=note,
            load=in_flight if callable(in_flight) else lambda: None,
        ))  # fmt: skip
    try:
        display.phase("load")
        await bench.load(handle)
        while True:
            snapshot = await bench.next()
            for line in snapshot.logs[seen_logs:]:
                display.log(line)
            seen_logs = len(snapshot.logs)
            display.snapshot(snapshot)
            if snapshot.status is not Status.RUNNING:
                final = snapshot
                break
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted.set()
        final = final.model_copy(update={"status": Status.FAILED, "error": "interrupted"})
        raise
    except UsageError:
        raise
    except MetraleError as exc:  # e.g. a record that could not be written: say it as it is
        final = BenchmarkResult(status=Status.FAILED, error=str(exc))
    except Exception as exc:  # a benchmark bug or a lost target: keep what finished, say why
        logger.debug("the run failed", exc_info=exc)  # -vv: where it came from
        final = BenchmarkResult(status=Status.FAILED, error=f"{type(exc).__name__}: {exc}")
    finally:
        if preflight_task is not None and not preflight_task.done():
            preflight_task.cancel()  # the run ended first: run.json says it did not answer
        try:
            # to its end, whatever cancels us meanwhile: it stops every runtime still running
            await finish(_quiet(bench.cleanup()))
        except asyncio.CancelledError:
            interrupted.set()
        try:
            scraper = handle.telemetry
            await finish(telemetry.aclose())
            if scraper is not None:
                merge_telemetry(final, scraper.summary(started, time.perf_counter()))
            final.logs += notes
        except asyncio.CancelledError:
            interrupted.set()
        display.close()
        wall = time.perf_counter() - started
        final.verdict = final.verdict.merged(check_bounds(final.metrics, request.budgets))
        code = EXIT_INTERRUPTED if interrupted.is_set() else exit_code(final)
        outcome = RunResult(
            info=info, run_dir=str(artifacts.run_dir), result=final, wall_s=wall, exit_code=code
        )
        try:
            if final.measured is not None:
                artifacts.write_summary(final.measured)
            artifacts.write_json("result.json", outcome)
        except RecordWriteError as exc:
            outcome.exit_code = EXIT_RUN_FAILED
            final.status, final.error = Status.FAILED, final.error or str(exc)
            display.log(LogLine(level="error", message=str(exc)))
    if interrupted.is_set():
        raise asyncio.CancelledError
    return outcome


def _preflight_done(
    task: asyncio.Task[Preflight],
    info: RunInfo,
    display: View,
    artifacts: RunArtifacts,
    write: bool,
) -> None:
    """The preflight's answer: a warning when it is wrong, and into run.json."""
    if task.cancelled():
        check = Preflight(ok=False, error="the run ended before the preflight answered")
    elif (exc := task.exception()) is not None:
        check = Preflight(ok=False, error=f"{type(exc).__name__}: {exc}")
    else:
        check = task.result()
    info.preflight = check
    if not check.ok and not task.cancelled():
        display.log(
            LogLine(
                level="warn",
                message="preflight: the model did not answer 2+2 with 4 "
                f"({check.error or repr(check.answer[:60])}); going on",
            )
        )
    if write:
        try:
            artifacts.write_json("run.json", info)
        except RecordWriteError as exc:
            logger.warning("run.json: the preflight's answer not written: %s", exc)


async def _quiet(work: Awaitable[None]) -> None:
    """A benchmark's cleanup that fails must not hide the run's own outcome: it is logged
    (`metrale -v` shows it; a runtime it did not stop is what `metrale cleanup` finds)."""
    try:
        await work
    except Exception as exc:
        logger.warning("benchmark cleanup failed: %s: %s", type(exc).__name__, exc, exc_info=exc)


def exit_code(result: BenchmarkResult) -> int:
    """0 done, 1 verdict failed, 3 run failed, which includes a run whose every rollout
    failed: it measured nothing."""
    if result.status is not Status.COMPLETED:
        return EXIT_RUN_FAILED
    rollouts, errors = result.metrics.get("rollouts"), result.metrics.get("errors")
    if rollouts and errors == rollouts:
        return EXIT_RUN_FAILED
    return EXIT_VERDICT_FAILED if result.verdict.passed is False else EXIT_OK


def resolve_runtime(
    name: str, options: Mapping[str, Any], no_runtime: str = "none"
) -> RuntimeConfig | None:
    """The checked runtime config a runtime name and its options (a sweep's runtime axis value)
    give; `no_runtime` runs in-process, no sandbox.

    `metrale.runtime.configs` is imported here, not at module top, so that a build without it
    still sweeps `none`. A runtime this machine cannot provide at all (no bwrap, no docker
    engine) is a usage error before any cell runs, not eight failed cells.
    """
    if name == no_runtime:
        if options:
            raise UsageError("runtime none takes no options")
        return None
    try:
        from metrale.runtime import configs
    except ImportError:
        raise UsageError(
            f"unknown runtime {name!r}; accepted: {no_runtime} (no runtimes are installed)"
        ) from None
    known = getattr(configs, "RUNTIMES", ())
    if known and name not in known:
        raise UsageError(f"unknown runtime {name!r}; accepted: {', '.join((no_runtime, *known))}")
    try:
        config = configs.runtime_config(name, **options)
        check = getattr(configs, "check_runtime", None)
        if check is not None:
            check(config)
    except UsageError:
        raise
    except ImportError as exc:
        raise UsageError(f"runtime {name} is not available in this build ({exc.name})") from None
    except (ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"runtime {name}: {first}") from None
    return config
