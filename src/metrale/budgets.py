"""Budgets: bounds on a benchmark's declared metrics, from a BENCH.toml the user names.

A budget is `<metric>_min` or `<metric>_max` under the benchmark's table, e.g.
`[gsm8k] reward_mean_min = 0.25`. Each metric must be one the benchmark declares; the check
itself (`plugin.check_bounds`) is part of the verdict.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale.bounds import CEILING, Bound
from metrale.errors import UsageError, read_user_file
from metrale.plugin import Metric, check_bounds


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
        field = f"budgets file {path}: {benchmark_id}.{key}"
        bounds[key] = float(Bound(-CEILING).check(value, field))
    check_bounds({}, bounds)  # validates the key names
    return bounds


def check_budget_metrics(
    bounds: Mapping[str, float], metrics: Sequence[Metric], benchmark_id: str
) -> None:
    """Every bounded metric is one the benchmark declares, else one line listing them."""
    declared = {m.name for m in metrics}
    for key in bounds:
        name = key.rsplit("_", 1)[0]
        if name not in declared:
            raise UsageError(
                f"budget {key!r}: {benchmark_id} declares no metric {name!r}; accepted: "
                + ", ".join(m.name for m in metrics)
            )
