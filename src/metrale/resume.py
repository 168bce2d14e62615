"""`metrale run --resume RUN_DIR`: what the resumed run is, taken from its `run.json`.

The benchmark, its parameters, the target and model, the runtime, the client options and the
budgets are the earlier run's: a resumed run measures the same thing or it is not a resume. A
flag given with `--resume` may repeat a value; one that differs is a usage error naming it, so
that no one resumes a different experiment into the same records by mistake.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale.endpoint.client import ClientOptions, Target
from metrale.errors import UsageError
from metrale.plugin import get_benchmark
from metrale.rundir import read_run_info
from metrale.runtime.base import RuntimeConfig


@dataclass
class ResumedRun:
    benchmark: str
    params: dict[str, Any]
    target: str | None  # None: the embedded model, started again
    model: str
    runtime: RuntimeConfig | None
    client: ClientOptions
    budgets: dict[str, float]


def resumed_run(
    run_dir: Path,
    args: argparse.Namespace,
    raw_params: Mapping[str, object],
    runtime: RuntimeConfig | None,
    client: ClientOptions,
    default_client: ClientOptions,
) -> ResumedRun:
    """The earlier run's settings; `UsageError` when a given flag contradicts one of them."""
    from metrale.runtime.configs import parse_runtime_config

    info = read_run_info(run_dir)
    bench_id = info["benchmark"]
    if args.benchmark not in (None, bench_id):
        raise UsageError(f"--resume {run_dir} is a {bench_id} run, not {args.benchmark}")
    if args.out is not None:
        raise UsageError("--out conflicts with --resume (the run directory is RUN_DIR)")
    params = dict(info.get("params") or {})
    if raw_params:
        given = get_benchmark(bench_id)().configure({**params, **raw_params})
        for key in raw_params:
            if given.get(key) != params.get(key):
                raise UsageError(
                    f"--{key.replace('_', '-')} {raw_params[key]} conflicts with the resumed "
                    f"run's {key}={params.get(key)!r} (run.json)"
                )
    embedded = bool(info.get("embedded"))
    target = None if embedded else str(info.get("target") or "")
    if args.target and (embedded or Target.normalize_url(args.target) != target):
        raise UsageError(f"--target {args.target} conflicts with the resumed run's target")
    model = str(info.get("model") or "")
    if args.model and args.model != model:
        raise UsageError(f"--model {args.model} conflicts with the resumed run's model {model}")
    stored = info.get("runtime")
    resumed_runtime = parse_runtime_config(stored) if stored else None
    if runtime is not None and (
        resumed_runtime is None or runtime.model_dump() != resumed_runtime.model_dump()
    ):
        raise UsageError("--runtime and its options conflict with the resumed run's runtime")
    stored_client = ClientOptions.model_validate(info.get("client") or {})
    for name in ClientOptions.model_fields:
        mine, default = getattr(client, name), getattr(default_client, name)
        if mine != default and mine != getattr(stored_client, name):
            raise UsageError(f"client option {name}={mine} conflicts with the resumed run's")
    if args.budgets is not None:
        raise UsageError("--budgets conflicts with --resume (the run's budgets are in run.json)")
    return ResumedRun(
        benchmark=bench_id,
        params=params,
        target=target,
        model=model,
        runtime=resumed_runtime,
        client=stored_client,
        budgets={k: float(v) for k, v in (info.get("budgets") or {}).items()},
    )
