"""serve's declarations: its parameters, its sweep axes, the run directory's levels file, and the
parsing of the parameters that hold lists (SLOs, percentiles)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from metrale.benchmarks.serve.search import SearchResult
from metrale.benchmarks.serve.slo import TierOutcome
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
    lanes: int | None = None
    stopped: str | None = None
    metrics: dict[str, float | int | None] = Field(default_factory=dict)
    #: load=sessions: per exact turn index, requests and TTFT/TPOT/ITL p50, p90 (ms)
    by_turn: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    #: each SLO tier at this level (name -> passed, criteria values, attainment)
    tiers: dict[str, TierOutcome] = Field(default_factory=dict)


class ServeLevels(BaseModel):
    """`levels.json`: what a serve run measured at each load level, and the sweep's knee."""

    load: str
    slos: dict[str, float] = Field(default_factory=dict)
    percentiles: list[float] = Field(default_factory=list)
    input_tokens_exact: bool | None = None
    levels: list[LevelSummary] = Field(default_factory=list)
    knee: int | None = None
    #: SLO tiers: name -> criteria, as given
    tiers: dict[str, str] = Field(default_factory=dict)
    search: SearchResult | None = None


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
    "max_tokens", "num_prompts", "requests", "duration_s", "api", "shared_prefix_tokens",
    "lanes", "sessions", "turns", "turn_tokens", "system_tokens", "tool_time",
)  # fmt: skip


def serve_parameters() -> list[ParamSpec]:
    """serve's parameters (the run-wide client flags are the runner's)."""
    return [
        ParamSpec(name="load", type="str", default="concurrency",
                  choices=["concurrency", "rate", "sweep", "sessions"],
                  help="fixed concurrency, a request rate, a sweep to the knee, or sessions"),
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
        ParamSpec(name="shared_prefix_tokens", type="int", default=0, min=0, max=1_000_000,
                  help="synthetic prompts all open with the same system message of this many "
                  "tokens (a prefix a server can cache)"),
        ParamSpec(name="trace", type="str", default="",
                  help="replay a Mooncake-format JSONL trace at its timestamps, open loop "
                  "(replaces the load; lengths and shared blocks as recorded)"),
        ParamSpec(name="trace_speed", type="float", default=1.0, min=0.001, max=1000.0,
                  help="trace time scale: 2 replays twice as fast"),
        ParamSpec(name="cache_block", type="int", default=16, min=1, max=4096,
                  help="tokens per block of the ideal prefix cache (vLLM's block size)"),
        max_tokens_param(128, "output token cap per request (a prompts file's own wins)"),
        ParamSpec(name="api", type="str", default="chat", choices=["chat", "completions"],
                  help="/chat/completions (messages) or /completions (a prompt string)"),
        ParamSpec(name="ignore_eos", type="bool", default=True,
                  help="ask the server to generate max_tokens regardless of EOS"),
        ParamSpec(name="temperature", type="float", default=0.0, min=0.0, max=2.0,
                  help="sampling temperature"),
        ParamSpec(name="slo", type="str", default="",
                  help="per-request SLOs for goodput (ttft_ms=200,tpot_ms=50,e2e_ms=5000,"
                  "itl_ms=...) and tiers of level criteria ([NAME:]ttft_p95<=2s,"
                  "session_goodput>=0.95; ...)"),
        ParamSpec(name="percentiles", type="str", default="50,90,99",
                  help="percentiles reported (plus mean and max)"),
        ParamSpec(name="seed", type="int", default=0, min=0,
                  help="prompts and arrival times"),
        ParamSpec(name="client_workers", type="str", default="1",
                  help="client processes for a concurrency level: N or auto (one per core); "
                  "each its own loop and connections, records merged"),
        *session_parameters(),
        ParamSpec(name="search", type="str", default="none",
                  choices=["none", "lanes", "concurrency", "rate"],
                  help="find the largest load meeting each --slo tier (bracketing, bisection)"),
        ParamSpec(name="search_range", type="str", default="1:64",
                  help="LOW:HIGH of the searched load"),
        ParamSpec(name="search_step", type="float", default=None, min=1e-6, nullable=True,
                  help="the search's resolution (1 for lanes/concurrency; (HIGH-LOW)/32 for rate)"),
    ]  # fmt: skip


def session_parameters() -> list[ParamSpec]:
    """The session workload's parameters (load=sessions; see `sessions` and `lanes`)."""
    return [
        ParamSpec(name="lanes", type="int", default=8, min=1, max=100_000,
                  help="sessions in flight, each lane one session after another (load=sessions)"),
        ParamSpec(name="sessions", type="int", default=16, min=1, nullable=True,
                  help="measured sessions per level (load=sessions; warmup/cooldown count "
                  "sessions too)"),
        ParamSpec(name="session_source", type="str", default="synthetic",
                  help="synthetic, a JSONL session file, a run directory's transcripts, or "
                  "live: real agents of --live-benchmark in real sandboxes (--runtime)"),
        ParamSpec(name="live_benchmark", type="str", default="terminal_bench",
                  help="session_source=live: the benchmark whose agent loop each session runs "
                  "(terminal_bench, agentic_webserver)"),
        ParamSpec(name="live_params", type="str", default="",
                  help="session_source=live: that benchmark's parameters, KEY=VALUE[,...] "
                  "(e.g. task=fix-git,max_turns=16)"),
        ParamSpec(name="turns", type="int", default=10, min=1, max=10_000,
                  help="turns per synthetic session"),
        ParamSpec(name="turn_tokens", type="int", default=200, min=1, max=1_000_000,
                  help="tokens (words) each synthetic turn adds: the user task, each tool result"),
        ParamSpec(name="system_tokens", type="int", default=1000, min=0, max=1_000_000,
                  help="tokens (words) of the system prompt every synthetic session shares"),
        ParamSpec(name="tool_time", type="str", default="exp:1",
                  help="tool time between synthetic turns: const:S, exp:MEAN, uniform:LO:HI"),
        ParamSpec(name="ramp_s", type="float", default=0.0, min=0.0, max=86_400.0,
                  help="seconds over which the lanes start, evenly spaced (0: all at once)"),
        ParamSpec(name="session_marker", type="bool", default=True,
                  help="open each recorded session's first user message with its number "
                  "(no cached prefix shared between lanes)"),
    ]  # fmt: skip
