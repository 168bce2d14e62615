"""The benchmark contract: what a benchmark declares, what it is handed, what it reports.

A benchmark is any class registered under the entry-point group `metrale.benchmarks` that
satisfies `Benchmark`. The runner drives it: `parameters()`, `configure(values)`,
`await load(handle)`, then `await next()` until a snapshot says completed or failed, and
`await cleanup()` on every exit path. This module does no I/O beyond reading entry points and a
budgets file the user names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import tomllib
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from metrale.endpoint.client import ClientOptions, Target
from metrale.errors import RunError, UsageError, read_user_file
from metrale.runtime.base import RuntimeConfig
from metrale.stats import Spread

ENTRY_POINT_GROUP = "metrale.benchmarks"

# --------------------------------------------------------------------------- parameters

ParamType = Literal["int", "float", "str", "bool"]
_PY_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


class ParamSpec(BaseModel):
    """One typed benchmark parameter. `nullable` parameters accept `none` (e.g. unbounded)."""

    name: str
    type: ParamType
    default: Any = None
    help: str = ""
    min: float | None = None
    max: float | None = None
    choices: list[Any] | None = None
    nullable: bool = False

    def describe_type(self) -> str:
        text = self.type
        if self.choices:
            text += " in {" + ", ".join(str(c) for c in self.choices) + "}"
        elif self.min is not None or self.max is not None:
            lo = "" if self.min is None else _num_text(self.min)
            hi = "" if self.max is None else _num_text(self.max)
            text += f" in [{lo}..{hi}]"
        if self.nullable:
            text += " or none"
        return text

    def coerce(self, raw: object) -> Any:
        """Convert a CLI string or a TOML/JSON value to this parameter's type, or raise."""
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in {"none", "null"}):
            if self.nullable:
                return None
            raise UsageError(
                f"parameter {self.name} cannot be none; accepted: {self.describe_type()}"
            )
        value = _convert(self, raw)
        if self.choices is not None and value not in self.choices:
            raise UsageError(
                f"parameter {self.name}={raw!s} is not one of: "
                + ", ".join(str(c) for c in self.choices)
            )
        if self.min is not None and value < self.min:
            raise UsageError(
                f"parameter {self.name}={raw!s} is below its minimum; accepted: "
                f"{self.describe_type()}"
            )
        if self.max is not None and value > self.max:
            raise UsageError(
                f"parameter {self.name}={raw!s} is above its maximum; accepted: "
                f"{self.describe_type()}"
            )
        return value


def _num_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _convert(spec: ParamSpec, raw: object) -> Any:
    wanted = spec.describe_type()
    if spec.type == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in {"1", "true", "yes", "on"}:
            return True
        if text in {"0", "false", "no", "off"}:
            return False
        raise UsageError(f"parameter {spec.name}={raw!s} is not a bool; accepted: true or false")
    if spec.type == "int":
        if isinstance(raw, bool):
            raise UsageError(f"parameter {spec.name}={raw!s} is not an int; accepted: {wanted}")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        try:
            return int(str(raw).strip().replace("_", ""))
        except ValueError:
            raise UsageError(
                f"parameter {spec.name}={raw!s} is not an int; accepted: {wanted}"
            ) from None
    if spec.type == "float":
        if isinstance(raw, bool):
            raise UsageError(f"parameter {spec.name}={raw!s} is not a number; accepted: {wanted}")
        try:
            return float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise UsageError(
                f"parameter {spec.name}={raw!s} is not a number; accepted: {wanted}"
            ) from None
    return str(raw)


class ParamValues(dict[str, Any]):
    """Validated parameter values, every declared parameter present (defaults filled in)."""


def validate_params(specs: Sequence[ParamSpec], raw: Mapping[str, object]) -> ParamValues:
    """Check `raw` against `specs`: unknown names, types, bounds; fill in defaults."""
    by_name = {s.name: s for s in specs}
    for name in raw:
        if name not in by_name:
            valid = ", ".join(sorted(by_name)) or "(none)"
            raise UsageError(f"unknown parameter {name!r}; valid parameters: {valid}")
    values = ParamValues()
    for spec in specs:
        values[spec.name] = spec.coerce(raw[spec.name]) if spec.name in raw else spec.default
    return values


# --------------------------------------------------------------------------- results


class Status(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class LogLine(BaseModel):
    level: Literal["info", "warn", "error"] = "info"
    message: str
    time: float = Field(default_factory=time.time)


class Check(BaseModel):
    """One bound checked for the verdict: `metric` must be `op` `limit`."""

    metric: str
    op: Literal[">=", "<="]
    limit: float
    value: float | None
    passed: bool
    reason: str = ""


class Verdict(BaseModel):
    """Pass/fail with every bound that was checked; `passed` is None when nothing was bounded."""

    checks: list[Check] = Field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        if not self.checks:
            return None
        return all(c.passed for c in self.checks)

    def merged(self, other: Verdict) -> Verdict:
        return Verdict(checks=[*self.checks, *other.checks])

    def lines(self) -> list[str]:
        return [
            f"{'PASS' if c.passed else 'FAIL'} {c.metric} = {_value_text(c.value)} "
            f"(must be {c.op} {_num_text(c.limit)})" + (f": {c.reason}" if c.reason else "")
            for c in self.checks
        ]


def _value_text(value: float | None) -> str:
    return "absent" if value is None else f"{value:.4g}"


class Table(BaseModel):
    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)


class BenchmarkResult(BaseModel):
    """A snapshot of a benchmark's state, returned by every `next()`; the last one is final."""

    status: Status = Status.RUNNING
    phase: str = ""
    elapsed_s: float = 0.0
    done: int = 0
    total: int | None = None
    summary: str = ""
    table: Table = Field(default_factory=Table)
    metrics: dict[str, float | int | None] = Field(default_factory=dict)
    stages: dict[str, Spread] = Field(default_factory=dict)
    verdict: Verdict = Field(default_factory=Verdict)
    logs: list[LogLine] = Field(default_factory=list)
    error: str | None = None


class Descriptor(BaseModel):
    id: str
    name: str
    summary: str


def check_bounds(metrics: Mapping[str, float | int | None], bounds: Mapping[str, float]) -> Verdict:
    """Turn `<metric>_min` / `<metric>_max` bounds into checks against `metrics`.

    A bounded metric that is absent fails its check: a budget on a number that was never
    measured is not met.
    """
    checks: list[Check] = []
    for key, limit in bounds.items():
        if key.endswith("_min"):
            metric, op = key[: -len("_min")], ">="
        elif key.endswith("_max"):
            metric, op = key[: -len("_max")], "<="
        else:
            raise UsageError(f"budget {key!r} must end in _min or _max (e.g. reward_min = 0.9)")
        value = metrics.get(metric)
        if value is None:
            checks.append(
                Check(metric=metric, op=op, limit=limit, value=None, passed=False, reason="absent")
            )
            continue
        ok = value >= limit if op == ">=" else value <= limit
        checks.append(Check(metric=metric, op=op, limit=limit, value=float(value), passed=ok))
    return Verdict(checks=checks)


def load_budgets(path: Path, benchmark_id: str) -> dict[str, float]:
    """Read the `[benchmark_id]` table of a BENCH.toml budgets file."""
    try:
        data = tomllib.loads(read_user_file(path, "budgets file"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"budgets file {path} is not valid TOML: {exc}") from None
    section = data.get(benchmark_id, {})
    if not isinstance(section, dict):
        raise UsageError(f"budgets file {path}: [{benchmark_id}] must be a table")
    bounds: dict[str, float] = {}
    for key, value in section.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"budgets file {path}: {benchmark_id}.{key} must be a number")
        bounds[key] = float(value)
    check_bounds({}, bounds)  # validates the key names
    return bounds


# --------------------------------------------------------------------------- the handle


class RecordWriteError(RunError):
    """A record could not be written (disk full, quota, I/O error): the run stops, exit 3."""


@dataclass
class Artifacts:
    """The run directory and its append-only logs (`rollouts.jsonl`, `requests.jsonl`, ...).

    Each line is written with one `os.write` on an unbuffered descriptor, so a line is on disk
    when `append_*` returns; a write that fails part-way (ENOSPC) is cut back to the last whole
    line and raises `RecordWriteError`: every earlier record stays intact and parseable.
    """

    run_dir: Path
    _fds: dict[str, int] = field(default_factory=dict, repr=False)
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)

    def path(self, name: str) -> Path:
        return self.run_dir / name

    def open(self, name: str = "rollouts.jsonl") -> None:
        """Open a log now, before any work: a run that cannot write its records does not
        start (and a low fd limit cannot take this descriptor away later)."""
        if name not in self._fds:
            try:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                self._fds[name] = fd = os.open(self.run_dir / name, flags, 0o644)
                self._sizes[name] = os.fstat(fd).st_size  # appends only: we track the end
            except OSError as exc:
                where = self.run_dir / name
                raise RecordWriteError(f"cannot open {where}: {exc.strerror}") from None

    def append_record(self, record: BaseModel) -> None:
        """Append one JSON line to rollouts.jsonl: a crash loses no finished rollout."""
        self.append_line("rollouts.jsonl", record)

    def append_line(self, name: str, record: BaseModel) -> None:
        """Append one JSON line to a log in the run directory (e.g. `requests.jsonl`)."""
        self.open(name)
        fd = self._fds[name]
        data = (record.model_dump_json() + "\n").encode()
        offset = self._sizes[name]
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self._sizes[name] = offset + len(data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, offset)  # no torn line: the file ends at the last whole record
            raise RecordWriteError(
                f"cannot write to {self.run_dir / name}: {exc.strerror}; "
                "the records before this one are intact"
            ) from None

    def write_json(self, name: str, model: BaseModel) -> Path:
        """Write a JSON file atomically (temporary file, then rename): never half a file."""
        target = self.run_dir / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        try:
            tmp.write_text(model.model_dump_json(indent=2) + "\n", encoding="utf-8")
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RecordWriteError(f"cannot write {target}: {exc.strerror}") from None
        return target

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class Resume:
    """What a resumed run already holds: the indices with a record that is kept (not re-run).

    The kept records themselves are read back from `rollouts.jsonl` with `records()`, one at a
    time, so that the summary covers every record without holding them all.
    """

    path: Path
    indices: frozenset[int]

    def records(self) -> Iterator[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


@dataclass
class PluginHandle:
    """What the runner hands a benchmark: its target, its run directory, and run-wide options."""

    target: Target
    artifacts: Artifacts
    client_options: ClientOptions = field(default_factory=ClientOptions)
    runtime: RuntimeConfig | None = None
    runtime_retries: int = 0
    on_status: Callable[[str], None] = lambda phase: None
    on_progress: Callable[[int, int | None], None] = lambda done, total: None
    cancelled: Callable[[], bool] = lambda: False
    #: set when the run resumes a run directory (`metrale run --resume`); see `Resumable`
    resume: Resume | None = None


# --------------------------------------------------------------------------- helpers


class BackgroundRun:
    """A benchmark's main coroutine, run once in the background while `next()` polls it.

    The shape every long benchmark shares: the first `next()` starts the work, each call waits
    at most a moment for it so that the runner can draw progress, and `cleanup()` cancels
    whatever still runs.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self.started = 0.0

    @property
    def started_yet(self) -> bool:
        return self._task is not None

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started if self.started else 0.0

    def start(self, work: Coroutine[Any, Any, Any]) -> None:
        self.started = time.perf_counter()
        self._task = asyncio.create_task(work)

    async def wait(self, timeout_s: float) -> bool:
        """True once the work has finished; its exception, if any, is raised here."""
        if self._task is None:
            raise RuntimeError("BackgroundRun.wait() before start()")
        done, _ = await asyncio.wait({self._task}, timeout=timeout_s)
        if done:
            self._task.result()
        return bool(done)

    def result(self) -> Any:
        if self._task is None:
            raise RuntimeError("BackgroundRun.result() before start()")
        return self._task.result()

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


# --------------------------------------------------------------------------- the protocol


@runtime_checkable
class Benchmark(Protocol):
    descriptor: ClassVar[Descriptor]

    def parameters(self) -> list[ParamSpec]: ...

    def configure(self, values: Mapping[str, object]) -> ParamValues: ...

    async def load(self, handle: PluginHandle) -> None: ...

    async def next(self) -> BenchmarkResult: ...

    async def cleanup(self) -> None: ...


@runtime_checkable
class Resumable(Protocol):
    """Optional: a benchmark that can resume a run directory (`metrale run --resume`). It runs
    only the rollouts whose index is not in `handle.resume.indices`, and its summary covers the
    records of `handle.resume.records()` as well as the new ones."""

    resumable: ClassVar[bool]


@runtime_checkable
class PlotsRuns(Protocol):
    """Optional: a benchmark whose run directory has a figure of its own (`metrale plot DIR`)."""

    @staticmethod
    def plot_run(run_dir: Path, output: Path) -> Path: ...


def run_benchmark_id(run_dir: Path) -> str | None:
    """The benchmark a `metrale run` directory belongs to (from its run.json), or None."""
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    bench = info.get("benchmark") if isinstance(info, dict) else None
    return bench if isinstance(bench, str) else None


def discover() -> dict[str, type[Benchmark]]:
    """Every benchmark registered under the `metrale.benchmarks` entry-point group."""
    found: dict[str, type[Benchmark]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.load()
    return dict(sorted(found.items()))


def get_benchmark(benchmark_id: str) -> type[Benchmark]:
    found = discover()
    if benchmark_id not in found:
        valid = ", ".join(found) or "(none installed)"
        raise UsageError(f"unknown benchmark {benchmark_id!r}; available: {valid}")
    return found[benchmark_id]
