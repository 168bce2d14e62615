"""What a sweep is: its axes, its cells and their names, read from flags or a TOML file.

A sweep is the product tier x runtime x rollouts x max_concurrent x each swept benchmark
parameter, in that order. Every axis value is checked here, before any cell runs, so that a bad
value is one line and exit 2, never a half-finished sweep. The cell name is the key that keeps
one results file per cell: `<runtime>-r<rollouts>[-c<max_concurrent>]`, prefixed by the tier
when the sweep has more than one, and suffixed by `-<param>=<value>` for each parameter that
takes more than one value.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from metrale.errors import UsageError, read_user_file
from metrale.plugin.params import STANDARD_AXES

#: The runtime axis value that runs rollouts in metrale's process, with no sandbox.
NO_RUNTIME = "none"
_TOML_KEYS = {
    "benchmark",
    "out",
    "runtime",
    "rollouts",
    "max_concurrent",
    "params",
    "tier",
    "runtime_options",
}
_NAME_OK = re.compile(r"^[A-Za-z0-9_.]+$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Tier:
    """A named deployment to sweep against; `target` None means the embedded model."""

    name: str
    target: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: everything needed to run it and to name its file."""

    name: str
    tier: Tier
    runtime: str
    rollouts: int | None
    max_concurrent: int | None
    params: Mapping[str, object]


@dataclass
class Sweep:
    benchmark: str
    out: Path
    runtimes: list[str]
    rollouts: list[int | None]
    max_concurrent: list[int | None]
    params: dict[str, list[object]] = field(default_factory=dict)
    tiers: list[Tier] = field(default_factory=lambda: [Tier("default")])
    runtime_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the user named the runtime axis (else a benchmark's default runtime may fill it)
    runtime_given: bool = False
    #: cell names start with the runtime (false for a benchmark that takes none: serve)
    named_runtime: bool = True

    def cells(self) -> list[Cell]:
        """Every cell in sweep order; `rollouts` is None for a benchmark without the axis."""
        keys = list(self.params)
        swept = [k for k in keys if len(self.params[k]) > 1]
        out: list[Cell] = []
        core = itertools.product(self.tiers, self.runtimes, self.rollouts, self.max_concurrent)
        for tier, runtime, rollouts, conc in core:
            for values in itertools.product(*(self.params[k] for k in keys)):
                params = dict(zip(keys, values, strict=True))
                name = cell_name(
                    runtime if self.named_runtime else None,
                    rollouts,
                    conc,
                    tier=tier.name if len(self.tiers) > 1 else None,
                    params={k: params[k] for k in swept},
                )
                out.append(Cell(name, tier, runtime, rollouts, conc, params))
        names = [c.name for c in out]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise UsageError(f"two cells would share the file {dup}.json; make the axes distinct")
        return out


def cell_name(
    runtime: str | None,
    rollouts: int | None,
    max_concurrent: int | None,
    *,
    tier: str | None = None,
    params: Mapping[str, object] | None = None,
) -> str:
    """`[<tier>-]<runtime>-r<rollouts>[-c<max_concurrent>][-<param>=<value>...]`; a part
    without a value (no runtime, no rollout count) is left out."""
    parts = [tier] if tier else []
    if runtime is not None:
        parts.append(runtime)
    if rollouts is not None:
        parts.append(f"r{rollouts}")
    if max_concurrent is not None:
        parts.append(f"c{max_concurrent}")
    for key, value in (params or {}).items():
        text = "none" if value is None else str(value)
        parts.append(f"{key}={re.sub(r'[^A-Za-z0-9_.+]', '_', text)}")
    return "-".join(parts) or "default"


def select(cells: Sequence[Cell], patterns: Sequence[str]) -> list[Cell]:
    """The cells whose name matches any glob in `patterns` (all when none are given)."""
    if not patterns:
        return list(cells)
    chosen = [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    if not chosen:
        names = ", ".join(c.name for c in cells)
        raise UsageError(f"--only {','.join(patterns)} matches no cell; the cells are: {names}")
    return chosen


# --------------------------------------------------------------------------- parsing


def split_list(text: str) -> list[str]:
    """`a,b, c` -> ['a', 'b', 'c']: how every swept flag takes several values."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UsageError(f"empty value in the list {text!r}")
    return items


def parse_rollouts(values: Sequence[object], source: str = "--rollouts") -> list[int | None]:
    out: list[int | None] = []
    for v in values:
        n = _as_int(v)
        if n is None or n < 1:
            raise UsageError(f"{source}: {v!r} is not a rollout count; accepted: integers >= 1")
        out.append(n)
    return _distinct(out, source)


def parse_max_concurrent(
    values: Sequence[object], source: str = "--max-concurrent"
) -> list[int | None]:
    """Integers >= 1, or `none` for unbounded."""
    out: list[int | None] = []
    for v in values:
        if v is None or (isinstance(v, str) and v.strip().lower() in {"none", "inf", "∞"}):
            out.append(None)
            continue
        n = _as_int(v)
        if n is None or n < 1:
            raise UsageError(
                f"{source}: {v!r} is not a concurrency cap; accepted: integers >= 1 or none"
            )
        out.append(n)
    return _distinct(out, source)


def parse_runtimes(values: Sequence[object], source: str = "--runtime") -> list[str]:
    out = []
    for v in values:
        if not isinstance(v, str) or not _NAME_OK.match(v):
            raise UsageError(f"{source}: {v!r} is not a runtime name")
        out.append(v)
    return _distinct(out, source)


def parse_param_flags(pairs: Sequence[str]) -> dict[str, list[object]]:
    """`-p key=v1,v2` flags: a comma list sweeps the parameter, one value fixes it."""
    out: dict[str, list[object]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"-p expects KEY=VALUE or KEY=V1,V2, got {pair!r}")
        out[key] = list(split_list(value))
    return _check_params(out, "-p")


def parse_tier_flag(text: str) -> Tier:
    """`NAME=URL[,model=M]`."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not rest or not _NAME_OK.match(name):
        raise UsageError(f"--tier expects NAME=URL[,model=M], got {text!r}")
    url, *opts = [p.strip() for p in rest.split(",")]
    model = None
    for opt in opts:
        key, sep, value = opt.partition("=")
        if key != "model" or not sep or not value:
            raise UsageError(f"--tier {name}: unknown option {opt!r}; accepted: model=M")
        model = value
    if not url:
        raise UsageError(f"--tier {name}: missing URL")
    return Tier(name, url, model)


def tiers_from_toml(items: object, source: str) -> list[Tier]:
    if not isinstance(items, list) or not items:
        raise UsageError(f"{source}: [[tier]] must be a list of tables")
    tiers = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise UsageError(f"{source}: tier {i + 1} must be a table")
        unknown = set(item) - {"name", "target", "model"}
        if unknown:
            raise UsageError(
                f"{source}: tier {i + 1}: unknown key {sorted(unknown)[0]!r}; "
                "accepted: name, target, model"
            )
        name, target, model = item.get("name"), item.get("target"), item.get("model")
        if not isinstance(name, str) or not _NAME_OK.match(name):
            raise UsageError(f"{source}: tier {i + 1} needs a name of letters, digits, _ or .")
        if target is not None and not isinstance(target, str):
            raise UsageError(f"{source}: tier {name}: target must be a URL string")
        if model is not None and not isinstance(model, str):
            raise UsageError(f"{source}: tier {name}: model must be a string")
        tiers.append(Tier(name, target, model))
    check_tiers(tiers)
    return tiers


def check_tiers(tiers: Sequence[Tier]) -> None:
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise UsageError(f"tier names must be distinct, got {', '.join(names)}")


def load_toml(path: Path) -> dict[str, Any]:
    """Read a sweep file; unknown keys are an error so that a typo never sweeps the default."""
    try:
        data = tomllib.loads(read_user_file(path, "sweep file"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"sweep file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - _TOML_KEYS
    if unknown:
        raise UsageError(
            f"sweep file {path}: unknown key {sorted(unknown)[0]!r}; accepted: "
            + ", ".join(sorted(_TOML_KEYS))
        )
    return data


def toml_list(data: Mapping[str, Any], key: str) -> list[object] | None:
    """A TOML axis: a scalar is one value, an array is swept; absent is None."""
    if key not in data:
        return None
    value = data[key]
    if isinstance(value, list):
        if not value:
            raise UsageError(f"sweep file: {key} is an empty list")
        return value
    if isinstance(value, dict):
        raise UsageError(f"sweep file: {key} must be a value or a list, not a table")
    return [value]


def toml_params(data: Mapping[str, Any]) -> dict[str, list[object]]:
    section = data.get("params", {})
    if not isinstance(section, dict):
        raise UsageError("sweep file: [params] must be a table")
    return _check_params({k: toml_list(section, k) or [] for k in section}, "[params]")


def toml_runtime_options(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    section = data.get("runtime_options", {})
    if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
        raise UsageError("sweep file: [runtime_options.<runtime>] must be tables")
    return {k: dict(v) for k, v in section.items()}


def _check_params(params: dict[str, list[object]], source: str) -> dict[str, list[object]]:
    for key in params:
        if key in STANDARD_AXES:  # the driver's axes have flags of their own
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"{source} {key}: set it with {flag}, which is a sweep axis")
        if not _NAME_OK.match(key):
            raise UsageError(f"{source}: {key!r} is not a parameter name")
    return params


def _as_int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def _distinct(values: list[_T], source: str) -> list[_T]:
    if len(set(values)) != len(values):
        raise UsageError(f"{source}: a value is listed twice")
    return values


def build_sweep(
    *,
    benchmark: str | None,
    config: Path | None,
    runtime: str | None,
    rollouts: str | None,
    max_concurrent: str | None,
    params: Sequence[str],
    param_values: Mapping[str, list[object]] | None = None,
    tiers: Sequence[str],
    target: str | None,
    model: str | None,
    out: Path | None,
) -> Sweep:
    """A sweep from flags and an optional TOML file; a flag overrides the file's axis.

    A file's `[params]` are merged with `-p` flags (and `param_values`, lists already split)
    key by key. Tiers come from `--tier` flags,
    else `[[tier]]` tables, else one tier from `--target`/`--model` (the embedded model when no
    target is given).
    """
    data = load_toml(config) if config is not None else {}
    name = benchmark or data.get("benchmark")
    if not isinstance(name, str) or not name:
        raise UsageError("name the benchmark: metrale matrix BENCHMARK, or benchmark = in the file")
    axes_runtime = parse_runtimes(
        split_list(runtime) if runtime is not None else toml_list(data, "runtime") or [NO_RUNTIME]
    )
    axes_rollouts = (
        parse_rollouts(split_list(rollouts))
        if rollouts is not None
        else parse_rollouts(toml_list(data, "rollouts") or [], "rollouts") or [None]
    )
    axes_conc = (
        parse_max_concurrent(split_list(max_concurrent))
        if max_concurrent is not None
        else parse_max_concurrent(toml_list(data, "max_concurrent") or [None], "max_concurrent")
    )
    swept = toml_params(data)
    swept.update(parse_param_flags(params))
    # already split by the caller, which knows the benchmark's axes (`metrale matrix` flags)
    swept.update(_check_params(dict(param_values or {}), "parameter"))
    if tiers:
        tier_list = [parse_tier_flag(t) for t in tiers]
        check_tiers(tier_list)
    elif "tier" in data:
        tier_list = tiers_from_toml(data["tier"], str(config))
    else:
        tier_list = [Tier("default", target, model)]
    if (tiers or "tier" in data) and (target or model):
        raise UsageError("give the target either by --target/--model or by tiers, not both")
    file_out = data.get("out")
    if file_out is not None and not isinstance(file_out, str):
        raise UsageError("sweep file: out must be a directory path string")
    out_dir = out if out is not None else Path(file_out or f"results/{name}")
    return Sweep(
        benchmark=name,
        out=out_dir,
        runtimes=axes_runtime,
        rollouts=axes_rollouts,
        max_concurrent=axes_conc,
        params=swept,
        tiers=tier_list,
        runtime_options=toml_runtime_options(data),
        runtime_given=runtime is not None or "runtime" in data,
    )
