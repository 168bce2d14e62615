"""`metrale run --resume RUN_DIR`: what the resumed run is, and what it takes from `run.json`.

The benchmark, its parameters, the model, the client options and the budgets are the earlier
run's: a resumed run measures the same thing or it is not a resume. A flag given with
`--resume` may repeat a value; one that differs is a usage error naming it, so that no one
resumes a different experiment into the same records by mistake.

A run directory is data, and it may come from anyone (a colleague, a download), so `run.json`
never decides what metrale executes, what of the host a sandbox reaches, or where the user's
credentials go:

- the **runtime** is built from the user's own flags (the benchmark's default without any),
  never from `run.json`; it must be the runtime the earlier run recorded, else the resume is
  refused, naming each option that differs (a docker CLI, a bind, a network, a limit) and the
  flag that would confirm it;
- the **target** the user's API key (`--api-key`, `$OPENAI_API_KEY`) goes to is one the user
  names with `--target` (it must be the recorded one); without a key, the recorded target is
  called as it is, with no credential;
- every field is read with its type (`rundir.StoredRun`), and what resume will use is printed
  (`ResumedRun.describe`) before any work.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale.endpoint.client import ClientOptions, Target
from metrale.errors import UsageError
from metrale.plugin import get_benchmark
from metrale.rundir import read_run_info
from metrale.runtime.base import RuntimeConfig

#: The runtime options a docker/bwrap/ray config holds, and the flag that gives each.
_OPTION_FLAGS = {
    "cli": "--docker-cli",
    "image": "--image",
    "binds": "--bind/--ro-bind",
    "network": "--network",
    "env": "--env",
    "address": "--ray-address",
    "inner": "--ray-inner",
    "limits": "--memory-mb/--max-procs/--cpu-seconds/--file-size-mb",
    "memory_mb": "--memory-mb",
    "max_procs": "--max-procs",
    "tmp_mb": "--tmp-mb",
    "output_cap_bytes": "--output-cap",
    "start_rate": "--runtime-rate",
    "start_limit": "--start-limit",
    "pool": "--runtime-pool",
}


@dataclass
class ResumedRun:
    benchmark: str
    params: dict[str, Any]
    target: str | None  # None: the embedded model, started again
    model: str
    runtime: RuntimeConfig | None
    client: ClientOptions
    budgets: dict[str, float]
    #: the user's API key goes to `target` (a target the user named)
    sends_key: bool = False

    def describe(self, run_dir: Path) -> list[str]:
        """What the resume will use, for the user to see before any work."""
        if self.target is None:
            target = "the embedded model"
        else:
            key = "with your API key" if self.sends_key else "with no API key"
            target = f"{self.target or '-'} ({key})"
        runtime = "none"
        if self.runtime is not None:
            changed = self.runtime.model_dump(mode="json", exclude_defaults=True)
            runtime = f"{self.runtime.type} {json.dumps(changed) if changed else '(defaults)'}"
        return [
            f"resuming {run_dir}: {self.benchmark}, model {self.model or '-'}, target {target}",
            f"  runtime (from your flags): {runtime}",
        ]


def resumed_run(
    run_dir: Path,
    args: argparse.Namespace,
    raw_params: Mapping[str, object],
    runtime: RuntimeConfig | None,
    client: ClientOptions,
    default_client: ClientOptions,
    api_key: str | None = None,
) -> ResumedRun:
    """The earlier run's settings; `UsageError` when a given flag contradicts one of them, or
    when `run.json` asks for something only the user may choose (see the module docstring).
    `runtime` is what the user's runtime flags give (None: none); `api_key` the user's key."""
    info = read_run_info(run_dir)
    where = f"--resume {run_dir}"
    bench_id = info.benchmark
    if args.benchmark not in (None, bench_id):
        raise UsageError(f"{where} is a {bench_id} run, not {args.benchmark}")
    if args.out is not None:
        raise UsageError("--out conflicts with --resume (the run directory is RUN_DIR)")
    params = dict(info.params)
    where_file = f"run file {run_dir / 'run.json'}"
    try:
        bench = get_benchmark(bench_id)()
    except UsageError as exc:
        raise UsageError(f"{where_file}: field benchmark: {exc}") from None
    if raw_params:
        given = bench.configure({**params, **raw_params})
        for key in raw_params:
            if given.get(key) != params.get(key):
                raise UsageError(
                    f"--{key.replace('_', '-')} {raw_params[key]} conflicts with the resumed "
                    f"run's {key}={params.get(key)!r} (run.json)"
                )
    try:
        bench.configure(params)
    except UsageError as exc:
        raise UsageError(f"{where_file}: field params: {exc}") from None
    target, sends_key = _target(info.embedded, info.target, args.target, api_key, where)
    model = info.model
    if args.model and args.model != model:
        raise UsageError(f"--model {args.model} conflicts with the resumed run's model {model}")
    resumed_runtime = _runtime(bench.runtime_choice(runtime), info.runtime, run_dir)
    stored_client = info.client
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
        budgets=dict(info.budgets),
        sends_key=sends_key,
    )


def _target(
    embedded: bool, stored: str, given: str | None, api_key: str | None, where: str
) -> tuple[str | None, bool]:
    """The target to call and whether the user's key goes to it: the key only ever goes to a
    target the user named (`--target`), and that must be the recorded one."""
    if not embedded and stored and not stored.startswith(("http://", "https://")):
        raise UsageError(
            f"{where}: run.json field target {stored!r} is not an http(s) URL; accepted: "
            "the base URL the run called"
        )
    if embedded:
        if given:
            raise UsageError(f"--target {given} conflicts with the resumed run's target")
        return None, False
    if given:
        if Target.normalize_url(given) != stored:
            raise UsageError(
                f"--target {given} conflicts with the resumed run's target {stored} (run.json)"
            )
        return Target.normalize_url(given), api_key is not None
    if api_key is not None and stored:
        raise UsageError(
            f"{where}: run.json names the target {stored}; your API key (--api-key or "
            "$OPENAI_API_KEY) goes only to a target you name: give --target "
            f"{stored} to confirm it, or unset the key"
        )
    return stored, False


def _runtime(
    derived: RuntimeConfig | None, stored: dict[str, Any] | None, run_dir: Path
) -> RuntimeConfig | None:
    """The runtime the user's flags give, when it is the one `run.json` recorded; else a
    UsageError naming what differs and the flag that would confirm it."""
    from metrale.runtime.configs import parse_runtime_config

    recorded = None
    if stored is not None:
        try:
            recorded = parse_runtime_config(stored)
        except UsageError as exc:
            raise UsageError(f"run file {run_dir / 'run.json'}: runtime: {exc}") from None
    if recorded is None and derived is None:
        return None
    if recorded is None or derived is None:
        had = recorded.type if recorded is not None else "none"
        raise UsageError(
            f"--resume {run_dir}: the run used runtime {had}; your flags give "
            f"{derived.type if derived is not None else 'none'}; accepted: --runtime {had}"
        )
    mine, theirs = derived.model_dump(mode="json"), recorded.model_dump(mode="json")
    differ = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    if not differ:
        return derived
    shown = "; ".join(
        f"{k}={json.dumps(theirs.get(k))[:80]} (yours {json.dumps(mine.get(k))[:80]}"
        f"{', give ' + _OPTION_FLAGS[k] if k in _OPTION_FLAGS else ''})"
        for k in differ[:3]
    )
    raise UsageError(
        f"--resume {run_dir}: run.json's {recorded.type} runtime differs from what your flags "
        f"give: {shown}; a run directory chooses no executable, bind, network or limit: "
        "repeat the run's runtime flags to resume it"
    )
