"""The benchmark contract: what a benchmark declares, what it is handed, what it reports.

A benchmark is a class registered under the entry-point group `metrale.benchmarks` that
satisfies `Benchmark`. The runner drives it: `configure(values)`, `runtime_choice(config)`,
`await load(handle)`, then `await next()` until a snapshot says completed or failed, and
`await cleanup()` on every exit path. Above the runner, nothing names a benchmark's parameters
or files: `matrix`, `report`, `compare`, `plot` and budgets read only the declarations here
(`parameters`, `sweep_axes`, `metrics`, `options`) and the run's `RunSummary`.

Rollout benchmarks get all of this from `metrale.rollout.RolloutBenchmark`; serve, which is not
rollout-shaped, from `metrale.plugin.lifecycle.BenchmarkBase` (the lifecycle every benchmark
shares, which `RolloutBenchmark` builds on). This package does no I/O beyond reading entry
points; only `lifecycle` reaches below it, opening the chat client when a run calls a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from metrale.entry import group
from metrale.errors import UsageError
from metrale.plugin.handle import Artifacts, PluginHandle, Resume
from metrale.plugin.metrics import Metric, MetricDeclaration, Stat, compute, find_metric
from metrale.plugin.params import (
    STANDARD_AXES,
    ParamSpec,
    ParamType,
    ParamValues,
    max_tokens_param,
    validate_params,
)
from metrale.plugin.results import (
    SCHEMA_VERSION,
    SUMMARY_STAGES,
    BenchmarkResult,
    Check,
    Descriptor,
    LogLine,
    RunSummary,
    Status,
    Table,
    Verdict,
    check_bounds,
    shown_stages,
)

if TYPE_CHECKING:
    from metrale.runtime.base import RuntimeConfig

ENTRY_POINT_GROUP = "metrale.benchmarks"

#: The run-wide flags a benchmark may honour (`Benchmark.options`); the CLI refuses, before
#: any work, each one given to a benchmark that does not list it.
#: - `runtime`: --runtime and its shaping flags (where rollouts' commands run)
#: - `retries`: --retries (per call, on connection errors, 429 and 5xx)
#: - `request_timeout`: --request-timeout; `stream`: --no-stream; `max_response`: --max-response-kb
RUN_OPTIONS: tuple[str, ...] = ("runtime", "retries", "request_timeout", "stream", "max_response")


@runtime_checkable
class Benchmark(Protocol):
    descriptor: ClassVar[Descriptor]
    #: which of `RUN_OPTIONS` this benchmark honours
    options: ClassVar[frozenset[str]]

    def parameters(self) -> list[ParamSpec]: ...

    def sweep_axes(self) -> list[str]:
        """The parameters a sweep may vary (more than one value each)."""
        ...

    def metrics(self) -> list[Metric]:
        """Every number this benchmark reports, declared once (after `configure`)."""
        ...

    def configure(self, values: dict[str, object]) -> ParamValues: ...

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        """The runtime this run will use, given the user's (None: none given); a UsageError
        when this benchmark cannot run there. What it returns is what run.json records."""
        ...

    def needs_model(self) -> bool:
        """False when this configuration calls no model: no target, probe or preflight."""
        ...

    async def load(self, handle: PluginHandle) -> None: ...

    async def next(self) -> BenchmarkResult: ...

    async def cleanup(self) -> None: ...


@runtime_checkable
class CallsInFlight(Protocol):
    """Optional: how many model calls a configured benchmark makes at once (None: no bound),
    so that the embedded server gets as many slots; `BenchmarkBase` gives every built-in one."""

    def calls_in_flight(self) -> int | None: ...


@runtime_checkable
class PlotsRuns(Protocol):
    """Optional: a benchmark whose run directory has a figure of its own (`metrale plot DIR`)."""

    @staticmethod
    def plot_run(run_dir: Path, output: Path) -> Path: ...


@runtime_checkable
class CurvesRuns(Protocol):
    """Optional: a benchmark whose run directory holds curves for `metrale report --html`.

    Each panel is `{"title", "x_label", "mark": x or None, "series": [{"name", "dashed",
    "points": [[x, y, hover text], ...]}]}`; the page draws the axes and lines.
    """

    @staticmethod
    def run_curves(run_dir: Path) -> list[dict[str, Any]]: ...


def discover() -> dict[str, type[Benchmark]]:
    """Every benchmark registered under the `metrale.benchmarks` entry-point group."""
    found: dict[str, type[Benchmark]] = {}
    for ep in group(ENTRY_POINT_GROUP):
        found[ep.name] = ep.load()
    return dict(sorted(found.items()))


def benchmark_ids() -> list[str]:
    """The ids of the installed benchmarks, read from their entry points without importing
    any of them."""
    return sorted({ep.name for ep in group(ENTRY_POINT_GROUP)})


def canonical_id(benchmark_id: str) -> str:
    """Benchmark ids accept `-` for `_`: `agentic-webserver` is `agentic_webserver`."""
    return benchmark_id.strip().replace("-", "_")


def get_benchmark(benchmark_id: str) -> type[Benchmark]:
    """The one benchmark asked for, loading only its module (loading every benchmark's put
    serve's HTTP client, ~80 ms of imports, into every run's start-up)."""
    key = canonical_id(benchmark_id)
    names = []
    for ep in group(ENTRY_POINT_GROUP):
        if ep.name == key:
            found: type[Benchmark] = ep.load()
            return found
        names.append(ep.name)
    valid = ", ".join(sorted(names)) or "(none installed)"
    raise UsageError(f"unknown benchmark {benchmark_id!r}; available: {valid}")


__all__ = [
    "ENTRY_POINT_GROUP",
    "RUN_OPTIONS",
    "SCHEMA_VERSION",
    "STANDARD_AXES",
    "SUMMARY_STAGES",
    "Artifacts",
    "Benchmark",
    "BenchmarkResult",
    "CallsInFlight",
    "Check",
    "CurvesRuns",
    "Descriptor",
    "LogLine",
    "Metric",
    "MetricDeclaration",
    "ParamSpec",
    "ParamType",
    "ParamValues",
    "PlotsRuns",
    "PluginHandle",
    "Resume",
    "RunSummary",
    "Stat",
    "Status",
    "Table",
    "Verdict",
    "benchmark_ids",
    "canonical_id",
    "check_bounds",
    "compute",
    "discover",
    "find_metric",
    "get_benchmark",
    "max_tokens_param",
    "shown_stages",
    "validate_params",
]
