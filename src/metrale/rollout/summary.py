"""The metrics every rollout benchmark reports, declared once, and the run's one summary.

Stage metrics are the p50 of the per-rollout durations (`setup`, `generation`, `scoring`,
`total`; see `pool` for what each stage covers); their samples are the summary's `durations`.
A benchmark's own metrics (`RolloutBenchmark.task_metrics`) are collected the same way, from
each record as it arrives, so memory stays 8 bytes a value and no record is kept.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from metrale.plugin import SCHEMA_VERSION, SUMMARY_STAGES, Metric, RunSummary
from metrale.rollout.pool import RUNTIME_DURATIONS, Progress
from metrale.rollout.records import RolloutRecord


def _stage(name: str) -> Metric:
    def duration(r: RolloutRecord) -> float | None:
        if name == "total":
            return r.total_s
        if name in RUNTIME_DURATIONS:
            value: float | None = getattr(r, f"{name}_s")
            return value
        timing = r.stages.get(name)
        return None if timing is None else timing.duration_s

    return Metric(
        name=name,
        unit="s",
        better="lower",
        stat="p50",
        value=duration,
        doc=f"p50 over rollouts of the {name} stage's duration (a failed stage counts "
        "until it failed)",
    )


def _runtime_duration(name: str, doc: str) -> Metric:
    return dataclasses.replace(_stage(name), doc=doc)


STAGE_METRICS: tuple[Metric, ...] = (
    *(_stage(s) for s in SUMMARY_STAGES),
    _runtime_duration(
        "setup_wait",
        "p50 over sandboxed rollouts of the time setup spent queued for a start "
        "slot (part of setup: the start limiter's wait, never hidden in it)",
    ),
    _runtime_duration(
        "stop",
        "p50 over sandboxed rollouts of their sandbox's stop(), after scoring (not in total)",
    ),
    _runtime_duration(
        "pool_start",
        "p50 over pooled rollouts of the warm pool's start of their sandbox, done ahead of "
        "them (--runtime-pool; not in setup: the start moved off the rollout's path)",
    ),
)


ROLLOUT_METRICS: tuple[Metric, ...] = (
    *STAGE_METRICS,
    Metric(
        "reward_mean", "reward", "higher", stat="mean", value=lambda r: r.reward,
        doc="mean of `reward` over the rollouts that have one (a failed rollout has none)",
    ),
    Metric(
        "error_rate", "fraction", "lower", stat="mean",
        value=lambda r: 0.0 if r.error is None else 1.0,
        doc="rollouts with an error / finished rollouts",
    ),
    Metric(
        "errors", "rollouts", "lower", stat="sum",
        value=lambda r: 0.0 if r.error is None else 1.0,
        doc="number of finished rollouts with an error",
    ),
    Metric(
        "retries", "calls", "lower", stat="sum", value=lambda r: float(r.retries),
        doc="sum over rollouts of chat-call retries (connection errors, 429, 5xx)",
    ),
    Metric(
        "e2e_s", "s", "lower", stat="value",
        doc="wall clock of the rollouts phase: first rollout started to last one ended",
    ),
)  # fmt: skip


def sampled(metrics: Iterable[Metric]) -> list[Metric]:
    """The metrics whose samples `Progress` collects: not stages (those are durations), not
    whole-run values."""
    stages = {*SUMMARY_STAGES, *RUNTIME_DURATIONS}
    return [m for m in metrics if m.name not in stages and m.value is not None]


def build_summary(progress: Progress, metrics: Sequence[Metric], e2e_s: float | None) -> RunSummary:
    """The run's summary from what `progress` collected; `e2e_s` is the rollouts phase.
    Means, sums, maxima and ratios are exact over every rollout; percentiles and the samples
    come from the kept values (every one up to `SAMPLE_CAP` rollouts, see `reservoir`)."""
    durations = {name: array("d", sorted(r.values)) for name, r in progress.durations.items()}
    found = {
        m.name: progress.samples[m.name] for m in sampled(metrics) if m.name in progress.samples
    }
    values: dict[str, float | int | None] = {}
    for m in metrics:
        if m.name in durations:
            values[m.name] = m.compute(durations[m.name])
        elif m.name == "e2e_s":
            values[m.name] = e2e_s
        elif m.value is not None and m.name not in RUNTIME_DURATIONS:
            x = found[m.name].statistic(m.stat) if m.name in found else None
            # a count reads as one: 3, not 3.0
            values[m.name] = (
                int(x) if m.stat in ("sum", "max") and x is not None and x.is_integer() else x
            )
    rewards = progress.samples.get("reward_mean")
    reservoirs = [*progress.durations.values(), *found.values()]
    return RunSummary.model_construct(  # built from numbers already checked: no copies
        schema_version=SCHEMA_VERSION,
        declared=[m.declaration() for m in metrics],
        unit="rollout",
        records=progress.done,
        errors=progress.errors,
        e2e_s=e2e_s,
        reward_mean=rewards.statistic("mean") if rewards is not None else None,
        rewards=[],  # the per-rollout rewards are the sample of reward_mean
        durations=durations,  # type: ignore[arg-type]  # arrays as lists: see RunSummary._lists
        metrics=values,
        samples={k: compact(r.kept()) for k, r in found.items()},  # type: ignore[misc]  # same
        sampled={r.name: r.n for r in reservoirs if r.sampled},
    )


#: A sample with at most this many distinct values is kept as values and counts.
COMPACT_DISTINCT = 64


def compact(sample: Sequence[Any]) -> Sequence[Any] | dict[str, list[Any]]:
    """`sample` as it goes into the summary: pairs as lists; few distinct values as
    `{"values", "counts"}` (see `RunSummary.samples`); else as it is (an 8-byte array)."""
    if sample and isinstance(sample[0], tuple):
        return [list(x) for x in sample]
    counts: dict[float, int] = {}
    for x in sample:
        counts[x] = counts.get(x, 0) + 1
        if len(counts) > COMPACT_DISTINCT:
            return sample
    ordered = sorted(counts)
    return {"values": ordered, "counts": [counts[v] for v in ordered]}


def summarize_records(
    records: Iterable[RolloutRecord], metrics: Sequence[Metric], e2e_s: float | None = None
) -> RunSummary:
    """The same summary from records read back (a run directory whose result was never
    written: a crashed cell)."""
    progress = Progress(keep_records=False, metrics=sampled(metrics))
    for record in records:
        progress.add(record)
    return build_summary(progress, metrics, e2e_s)
