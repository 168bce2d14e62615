"""What a benchmark reports: live snapshots, the final result, its one summary, the verdict.

`RunSummary` is the one result summary of a run: the runner writes it in result.json, a matrix
cell file embeds it, and report, compare, plot and budgets read it (with the benchmark's
declared metrics, `plugin.metrics`) and nothing else.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import BaseModel, Field, field_serializer

from metrale.errors import UsageError
from metrale.fmt import sig
from metrale.plugin.metrics import MetricDeclaration
from metrale.plugin.per_task import TaskSummary
from metrale.stats import Spread

#: The per-rollout stage columns every rollout summary shows, in order (`total` last).
SUMMARY_STAGES: tuple[str, ...] = ("setup", "generation", "scoring", "total")

#: The shape of `RunSummary` (summary.json, and every matrix cell file) this metrale writes.
#: 1: no version field, no declarations (read with the installed benchmark's); 2: both.
SCHEMA_VERSION = 2


def _num_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


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
    return "absent" if value is None else sig(value, 4)


class Table(BaseModel):
    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)


class RunSummary(BaseModel):
    """What a run measured, in one shape for every benchmark.

    - `unit`: what one sample is: `rollout` (a rollout record) or `request` (serve).
    - `records`: finished units; `errors`: those that failed.
    - `e2e_s`: the wall clock of the run's work: first rollout (or request) started to last one
      ended, as the benchmark's phase clock reads it. Load, warm-up and the target's start are
      not in it. The same number in `run`, in `matrix` progress and in `report`.
    - `reward_mean`: mean over units that have a reward (its sample holds the rewards;
      `rewards` is read from cell files written before samples were kept).
    - `durations`: sorted per-rollout seconds of each stage and of total (rollout benchmarks).
    - `metrics`: the value of every declared metric, and a benchmark's extra counters.
    - `samples`: per declared metric (not stages: those are `durations`), the values its
      statistic was taken over; a ratio's are [value, per] pairs. A sample of few distinct
      values (0/1 flags, token counts) is kept as `{"values": [...], "counts": [...]}`:
      1,000,000 error flags are two numbers, not a million.
    - `per_task`: a run over a dataset, task by task (`plugin.per_task`); empty otherwise.
    - `schema_version`, `declared`: the shape of the file, and the declaration of each metric
      (unit, direction, statistic, column), so that a reader needs nothing of the benchmark
      installed now (`from_file_data` reads a file without them as version 1).

    The runner writes it to `summary.json` in the run directory (compact JSON: it holds a
    number per rollout and stage); result.json holds the rest of the final snapshot.
    """

    schema_version: int = SCHEMA_VERSION
    #: every metric the summary's numbers are declared by, as the run's benchmark declared it
    declared: list[MetricDeclaration] = Field(default_factory=list)
    unit: Literal["rollout", "request"] = "rollout"
    records: int = Field(default=0, description="finished units (rollouts or requests)")
    errors: int = 0
    e2e_s: float | None = None
    reward_mean: float | None = None
    rewards: list[float] = Field(default_factory=list, description="old files: sorted rewards")
    durations: dict[str, list[float]] = Field(
        default_factory=lambda: {s: list[float]() for s in SUMMARY_STAGES}
    )
    metrics: dict[str, float | int | None] = Field(default_factory=dict)
    #: numbers, or pairs for a ratio's sample; typed so that a file read back cannot hand a
    #: statistic a string (`matrix.compare` bootstraps these)
    samples: dict[str, list[float | list[float] | None] | dict[str, list[float]]] = Field(
        default_factory=dict
    )
    sampled: dict[str, int] = Field(
        default_factory=dict,
        description="metrics and stages whose values in `durations`/`samples` are a uniform "
        "sample of their rollouts (past metrale's cap per metric), with how many rollouts "
        "had a value; their means, sums and ratios are still exact",
    )
    per_task: list[TaskSummary] = Field(default_factory=list)

    def __repr_args__(self) -> Any:
        """Sizes, not the per-rollout numbers: asyncio's repr of a finished task reprs its
        result, and the full repr of 100,000 rollouts cost 75 MB at a run's end."""
        for key, value in super().__repr_args__():
            if key in ("durations", "samples", "rewards") and value:
                sizes = value.items() if isinstance(value, dict) else [("n", value)]
                value = {k: f"<{len(v)} values>" for k, v in sizes}
            yield key, value

    @field_serializer("durations", "samples")
    def _lists(self, value: dict[str, Any]) -> dict[str, Any]:
        """The runner builds the summary from 8-byte arrays (`array("d")`), not lists of float
        objects (32 bytes each): they become JSON lists only as they are written."""
        return {k: v.tolist() if isinstance(v, array) else v for k, v in value.items()}

    def stage(self, name: str) -> list[float]:
        return self.durations.get(name, [])

    @classmethod
    def from_file_data(cls, data: Any, where: object) -> Self:
        """Validate a summary (or a cell file) read from `where`: one without a version is
        version 1; one newer than this metrale writes is a UsageError naming file and version.
        A ValidationError is left to the caller, which knows what the file should have been."""
        if isinstance(data, dict):
            version = data.setdefault("schema_version", 1)
            if not isinstance(version, int) or isinstance(version, bool):
                raise UsageError(f"{where}: schema_version {version!r} is not a whole number")
            if version > SCHEMA_VERSION:
                raise UsageError(
                    f"{where} has schema version {version}; this metrale reads up to "
                    f"{SCHEMA_VERSION}: upgrade metrale to read it"
                )
        return cls.model_validate(data)

    def sample(self, name: str) -> list[Any]:
        """The sample behind metric `name`: a stage's durations, or a declared metric's values
        (pairs as tuples for a ratio)."""
        if name in self.durations:
            return self.durations[name]
        found = self.samples.get(name, [])
        if isinstance(found, dict):  # the compact form: each value repeated by its count
            pairs = zip(found.get("values", []), found.get("counts", []), strict=True)
            found = [v for v, n in pairs for _ in range(int(n))]
        return [tuple(x) if isinstance(x, list) else x for x in found]


def shown_stages(*summaries: RunSummary) -> list[str]:
    """The duration columns a run's table (or a sweep's, one summary per cell) shows: the
    stages, with `pool_start` and `setup_wait` before setup and `stop` after scoring when any
    of the summaries has them (rollouts that started sandboxes; a warm pool's)."""

    def present(name: str) -> bool:
        return any(s.stage(name) for s in summaries)

    shown = []
    for name in SUMMARY_STAGES:
        if name == "setup":
            shown += [extra for extra in ("pool_start", "setup_wait") if present(extra)]
        shown.append(name)
        if name == "scoring" and present("stop"):
            shown.append("stop")
    return shown


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
    #: the run's one summary, on the final snapshot (None while running, or when nothing ran);
    #: written apart, to summary.json, not inside result.json
    measured: RunSummary | None = Field(default=None, exclude=True, repr=False)
    # What the live view shows (`metrale.live`); None where the benchmark has no such number.
    #: failed units so far, and chat-call retries so far
    errors: int | None = None
    retries: int | None = None
    #: running mean reward over finished rollouts that have one
    reward_mean: float | None = None
    #: running p50 so far, seconds, by name: stages (generation, total) of finished rollouts,
    #: or serve's ttft and tpot of the current level
    running_p50_s: dict[str, float] = Field(default_factory=dict)
    #: agent turns of the finished rollouts (agentic benchmarks)
    turns: int | None = None
    #: serve: the load level running, and its requests in flight
    level: str | None = None
    in_flight: int | None = None


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
    op: Literal[">=", "<="]
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
