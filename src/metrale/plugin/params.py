"""Typed benchmark parameters: what a benchmark declares, and how raw values are checked.

A raw value comes from a CLI string, a TOML sweep file or a run.json; `ParamSpec.coerce` turns it
into the declared type or raises a `UsageError` that names the parameter and what is accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from metrale.bounds import CEILING
from metrale.errors import UsageError

ParamType = Literal["int", "float", "str", "bool"]
#: The sweep axes every rollout benchmark has (its rollout count and concurrency bound); a
#: sweep and a cell name them apart from the benchmark's own parameters.
STANDARD_AXES: tuple[str, ...] = ("rollouts", "max_concurrent")

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
        text: str = self.type
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
        if self.type in ("int", "float") and not (
            math.isfinite(value) and abs(value) <= CEILING
        ):  # NaN passes every comparison below, and an infinity every missing maximum
            raise UsageError(
                f"parameter {self.name}={raw!s} is not a finite number of at most {CEILING:.0e}; "
                f"accepted: {self.describe_type()}"
            )
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
            return float(raw)  # type: ignore[arg-type]  # any other type: TypeError, below
        except (TypeError, ValueError):
            raise UsageError(
                f"parameter {spec.name}={raw!s} is not a number; accepted: {wanted}"
            ) from None
    return str(raw)


#: How `max_tokens none` behaves, said once for every benchmark that calls a model.
UNBOUNDED_TOKENS_RULE = (
    "none = send no cap: the server's own limit applies (on llama.cpp, vLLM and SGLang the "
    "context left after the prompt)"
)


def max_tokens_param(default: int, what: str) -> ParamSpec:
    """The `max_tokens` parameter every benchmark that calls a model shares, so that
    `--max-tokens none` means the same everywhere: the call carries no `max_tokens` and the
    server stops the generation where its own rule says (`UNBOUNDED_TOKENS_RULE`)."""
    return ParamSpec(
        name="max_tokens",
        type="int",
        default=default,
        min=1,
        max=1_000_000,
        nullable=True,
        help=f"{what}; {UNBOUNDED_TOKENS_RULE}",
    )


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
