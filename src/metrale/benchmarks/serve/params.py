"""serve's declarations: its parameters, its sweep axes, the run directory's levels file, and the
parsing of the parameters that hold lists (SLOs, percentiles)."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from metrale.benchmarks.serve.metrics import SLO_KEYS
from metrale.errors import UsageError
from metrale.plugin import ParamSpec, max_tokens_param

LEVELS_FILE = "levels.json"
REQUESTS_FILE = "requests.jsonl"


class LevelSummary(BaseModel):
    index: int
    label: str
    concurrency: int | None = None
    rate: float | None = None
    arrivals: str | None = None
    stopped: str | None = None
    metrics: dict[str, float | int | None] = Field(default_factory=dict)


class ServeLevels(BaseModel):
    """`levels.json`: what a serve run measured at each load level, and the sweep's knee."""

    load: str
    slos: dict[str, float] = Field(default_factory=dict)
    percentiles: list[float] = Field(default_factory=list)
    input_tokens_exact: bool | None = None
    levels: list[LevelSummary] = Field(default_factory=list)
    knee: int | None = None


def parse_slos(text: str) -> dict[str, float]:
    """`ttft_ms=200,tpot_ms=50` -> {"ttft_ms": 200.0, "tpot_ms": 50.0}."""
    slos: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"slo {part!r} is not KEY=MS; accepted keys: {', '.join(SLO_KEYS)}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise UsageError(f"slo {part!r}: {value!r} is not a number of ms") from None
        if not math.isfinite(slos[key]) or slos[key] <= 0:
            raise UsageError(f"slo {part!r} must be a positive number of ms")
    return slos


def parse_percentiles(text: str) -> list[float]:
    try:
        qs = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"percentiles {text!r}: expected numbers like 50,90,99") from None
    if not qs or any(not 0 <= q <= 100 for q in qs):
        raise UsageError(f"percentiles {text!r}: each must be within 0..100")
    return qs


#: The parameters a sweep may vary: the load, and the shape of each request.
SWEEP_AXES = (
    "concurrency", "rate", "arrivals", "burstiness", "max_concurrency", "input_tokens",
    "max_tokens", "num_prompts", "requests", "duration_s", "api",
)  # fmt: skip


def serve_parameters() -> list[ParamSpec]:
    """serve's parameters (the run-wide client flags are the runner's)."""
    return [
        ParamSpec(name="load", type="str", default="concurrency",
                  choices=["concurrency", "rate", "sweep"],
                  help="fixed concurrency, a request rate, or a sweep to the knee"),
        ParamSpec(name="concurrency", type="int", default=8, min=1, max=100_000,
                  help="requests in flight (load=concurrency)"),
        ParamSpec(name="rate", type="float", default=None, min=0.001, nullable=True,
                  help="requests/s (load=rate)"),
        ParamSpec(name="arrivals", type="str", default="poisson",
                  choices=["poisson", "gamma", "constant"],
                  help="arrival process for load=rate and the sweep's rates"),
        ParamSpec(name="burstiness", type="float", default=1.0, min=0.01, max=100.0,
                  help="gamma shape: <1 burstier than Poisson, 1 Poisson, >1 smoother"),
        ParamSpec(name="max_concurrency", type="int", default=None, min=1, nullable=True,
                  help="cap on requests in flight at a rate; waits are queue wait"),
        ParamSpec(name="requests", type="int", default=100, min=1, nullable=True,
                  help="measured requests per level (with duration_s: whichever first)"),
        ParamSpec(name="duration_s", type="float", default=None, min=0.01, nullable=True,
                  help="measured seconds per level"),
        ParamSpec(name="warmup", type="int", default=0, min=0,
                  help="warm-up requests per level, not measured"),
        ParamSpec(name="warmup_s", type="float", default=0.0, min=0.0,
                  help="warm-up seconds per level, not measured"),
        ParamSpec(name="cooldown", type="int", default=0, min=0,
                  help="cool-down requests per level (load kept on), not measured"),
        ParamSpec(name="cooldown_s", type="float", default=0.0, min=0.0,
                  help="cool-down seconds per level, not measured"),
        ParamSpec(name="max_error_rate", type="float", default=0.5, min=0.0, max=1.0,
                  nullable=True, help="stop a level (and a sweep) above this error rate"),
        ParamSpec(name="sweep_levels", type="int", default=5, min=1, max=100,
                  help="rates between the concurrency-1 rate and saturation"),
        ParamSpec(name="sweep_concurrency", type="int", default=64, min=2, max=100_000,
                  help="the sweep's saturating concurrency"),
        ParamSpec(name="prompts", type="str", default="synthetic",
                  help="synthetic, gsm8k, or a JSONL file (prompt or messages a line)"),
        ParamSpec(name="input_tokens", type="int", default=128, min=1, max=1_000_000,
                  help="synthetic prompt length (exact where the server tokenizes)"),
        ParamSpec(name="num_prompts", type="int", default=64, min=1, max=100_000,
                  help="distinct synthetic prompts, used in turn"),
        max_tokens_param(128, "output token cap per request (a prompts file's own wins)"),
        ParamSpec(name="api", type="str", default="chat", choices=["chat", "completions"],
                  help="/chat/completions (messages) or /completions (a prompt string)"),
        ParamSpec(name="ignore_eos", type="bool", default=True,
                  help="ask the server to generate max_tokens regardless of EOS"),
        ParamSpec(name="temperature", type="float", default=0.0, min=0.0, max=2.0,
                  help="sampling temperature"),
        ParamSpec(name="slo", type="str", default="",
                  help="SLOs for goodput: ttft_ms=200,tpot_ms=50,e2e_ms=5000,itl_ms=..."),
        ParamSpec(name="percentiles", type="str", default="50,90,99",
                  help="percentiles reported (plus mean and max)"),
        ParamSpec(name="seed", type="int", default=0, min=0,
                  help="prompts and arrival times"),
    ]  # fmt: skip
