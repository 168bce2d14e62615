"""serve's declared metrics and the samples behind them, for compare, report, plot and budgets.

The values are those of `metrics.summarize` (the definitions live there, once); this module
says, for each, its unit and direction, and gives the sample its statistic is taken over, so
that `compare` can put a bootstrap interval on it:

- latency metrics (`ttft_ms_p50`, ...): the per-request values in ms (ITL: every per-token
  gap), the statistic the percentile;
- throughputs (`request_throughput`, `output_throughput`, `goodput`): batch means. The measured
  window is cut into `WINDOWS` equal windows and each request counted in the window its stream
  ended in; the sample is the per-window rate, whose mean is exactly the level's rate;
- `error_rate`: per request 0/1, the mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metrale.benchmarks.serve.metrics import (
    RequestRecord,
    itl_samples,
    measured_window,
    meets_slos,
    tpot,
)
from metrale.benchmarks.serve.session_metrics import LIVE_METRICS, SESSION_METRICS
from metrale.plugin import Metric
from metrale.plugin.metrics import Stat

#: Windows the measured window is cut into for the throughput samples.
WINDOWS = 10
#: Latency series and the per-request value each is a percentile of (seconds).
_LATENCY = {
    "ttft": "time to the first output chunk (content, reasoning or a tool call; TTFC, first "
    "content, is not this), from the send (`metrale.endpoint.stream`)",
    "tpot": "(E2E - TTFT) / (output tokens - 1), per request",
    "itl": "gap between consecutive output chunks, every gap of every request",
    "e2e": "send to the end of the stream",
}
_QS: tuple[Stat, ...] = ("p50", "p90", "p99")


def _latency_metrics() -> list[Metric]:
    out = []
    for name, what in _LATENCY.items():
        for q in _QS:
            out.append(
                Metric(f"{name}_ms_{q}", "ms", "lower", stat=q,
                       column=q == "p50", doc=f"{q} over measured successful requests of {what}")
            )  # fmt: skip
    return out


METRICS: tuple[Metric, ...] = (
    *_latency_metrics(),
    Metric("request_throughput", "req/s", "higher", stat="mean", column=True,
           doc="successful requests / measured window"),
    Metric("output_throughput", "tok/s", "higher", stat="mean", column=True,
           doc="output tokens of successful requests / measured window"),
    Metric("goodput", "req/s", "higher", stat="mean",
           doc="successful requests meeting every SLO / measured window"),
    Metric("error_rate", "fraction", "lower", stat="mean",
           doc="failed measured requests / measured requests"),
    *SESSION_METRICS,
    *LIVE_METRICS,
    Metric("capacity", "load", "higher", stat="value",
           doc="--search: the largest load (lanes, concurrency or req/s) meeting the first SLO "
           "tier (capacity.<tier> for each)"),
    Metric("prefix_hit_rate_ideal", "fraction", None, stat="ratio",
           doc="prompt tokens an unbounded perfect prefix cache would serve / prompt tokens, "
           "block-granular (`metrale.prefix`), from the prompts in the order sent"),
    Metric("prefix_hit_rate_server", "fraction", "higher", stat="ratio",
           doc="usage cached_tokens / usage prompt_tokens over the requests reporting them"),
    Metric("prefix_cache_efficiency", "fraction", "higher", stat="value",
           doc="prefix_hit_rate_server / prefix_hit_rate_ideal"),
)  # fmt: skip


def samples(records: Sequence[RequestRecord], slos: Mapping[str, float]) -> dict[str, list[Any]]:
    """The sample of each declared metric over one level's records (see the module docstring)."""
    measured = [r for r in records if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    series = {
        "ttft": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        "tpot": [x * 1000 for r in ok if (x := tpot(r)) is not None],
        "itl": [x * 1000 for r in ok for x in itl_samples(r)],
        "e2e": [r.e2e_s * 1000 for r in ok if r.e2e_s is not None],
    }
    out: dict[str, list[Any]] = {
        f"{name}_ms_{q}": values for name, values in series.items() for q in _QS
    }
    out["error_rate"] = [0.0 if r.ok else 1.0 for r in measured]
    out["prefix_hit_rate_ideal"] = [
        (float(r.ideal_cached_tokens), float(r.ideal_prompt_tokens))
        for r in ok
        if r.ideal_cached_tokens is not None and r.ideal_prompt_tokens
    ]
    out["prefix_hit_rate_server"] = [
        (float(r.cached_tokens), float(r.prompt_tokens))
        for r in ok
        if r.cached_tokens is not None and r.prompt_tokens
    ]
    window = measured_window(measured)
    if window is None:
        return out
    width = window.duration_s / WINDOWS
    reqs, toks, good = [0.0] * WINDOWS, [0.0] * WINDOWS, [0.0] * WINDOWS
    for r in ok:
        end = r.end_s if r.end_s is not None else window.end_s
        i = min(int((end - window.start_s) / width), WINDOWS - 1) if width > 0 else 0
        reqs[i] += 1
        toks[i] += r.output_tokens or 0
        good[i] += 1 if meets_slos(r, slos) else 0
    out["request_throughput"] = [x / width for x in reqs]
    out["output_throughput"] = [x / width for x in toks]
    out["goodput"] = [x / width for x in good]
    return out
