"""Every number the serve benchmark reports, defined once, with its formula beside its code.

Clocks: all times come from `time.perf_counter()`. A request record keeps its intended, ready and
send times in seconds since the run began (`*_s`), and its chunk times in seconds since its own
send. What one response says and when (send, *chunk*, TTFT, TTFC, E2E, chunk times, output
tokens and `token_source`, tokens per chunk) is defined in `metrale.endpoint.stream`, once for
every client in metrale; serve's client fills its records from there. In short:

- **TTFT** = first output chunk − send (reasoning and tool calls count); **TTFC** = first
  content chunk − send, reported apart.
- **E2E** = the read carrying the stream's last event (`[DONE]`) − send; non-streaming
  (`--no-stream`): TTFT = E2E = the body read whole − send.
- **output tokens** = server `usage.completion_tokens` (`token_source = "usage"`), else the
  number of chunks (`"counted"`).

What this module adds, for one request (send = the moment the request is handed to the
connection):

- **queue wait** = ready − intended: time waiting client-side for a concurrency slot (rate mode
  with `max_concurrency`); 0 otherwise.
- **scheduling lag** = send − ready: how late the client's event loop actually sent a request
  that could go. It measures the client, not the server; metrale keeps it well under 1 ms.
- **connect** = the connect (and TLS) time of a request that opened its connection, apart from
  its TTFT, which counts from the write to the open connection (`endpoint.stream`); a warm-up
  (`--warmup`) opens the level's connections before the measured phase.
- **client lag** = per request, the longest time from a piece's arrival to the end of its
  processing (`endpoint.stream`): the client's own health, beside the scheduling lag. Chunks
  are stamped on arrival, so a busy client does not move them, until it falls a whole chunk
  interval behind.
- **TPOT** = (E2E − TTFT) / (output tokens − 1), for requests with at least 2 output tokens.
- **ITL** = the gaps between consecutive chunks (`endpoint.stream.chunk_gaps`), each divided by
  the tokens its later chunk carries and counted once per token, pooled over requests: a
  4-token chunk 40 ms after the previous one adds four samples of 10 ms, so multi-token chunks
  (speculative decoding, batched flushes) do not skew it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from metrale.endpoint.stream import chunk_gaps
from metrale.endpoint.stream import spread_tokens as spread_tokens
from metrale.stats import mean, percentile

Phase = Literal["warmup", "measure", "cooldown"]
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


class RequestRecord(BaseModel):
    """One request: written as a line of `requests.jsonl` as it ends."""

    level: int
    index: int
    phase: Phase
    started_at: float = Field(0.0, description="wall clock at send, epoch s")
    intended_s: float = Field(description="when the load generator meant to send it")
    ready_s: float = Field(description="when a concurrency slot let it go (>= intended)")
    send_s: float | None = Field(None, description="when it was handed to the connection pool")
    sent_s: float | None = Field(
        None, description="when it was written to an open connection (chunk times count from it)"
    )
    connect_s: float | None = Field(
        None, description="connect (+ TLS) time of the connection it opened; None when reused"
    )
    client_lag_s: float | None = Field(
        None, description="longest time from a piece's arrival to the end of its processing"
    )
    end_s: float | None = Field(None, description="end of stream or of the failure")
    ttft_s: float | None = None
    ttfc_s: float | None = None
    e2e_s: float | None = None
    chunk_times_s: list[float] = Field(default_factory=list, description="since sent")
    chunk_tokens: list[float] = Field(default_factory=list, description="tokens per chunk")
    reasoning_chunks: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = Field(
        None, description="usage.prompt_tokens_details.cached_tokens: served by the server's cache"
    )
    ideal_prompt_tokens: int | None = Field(
        None, description="prompt tokens by metrale.prefix's rule (whitespace words)"
    )
    ideal_cached_tokens: int | None = Field(
        None, description="of those, what an unbounded perfect prefix cache would serve"
    )
    output_tokens: int | None = None
    token_source: Literal["usage", "counted"] | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    session: str | None = Field(None, description="session id (load=sessions)")
    turn: int | None = Field(None, description="turn index within its session, from 1")
    tool_s: float | None = Field(None, description="tool time before this turn (s)")

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None


# --------------------------------------------------------------------------- one request


def queue_wait(r: RequestRecord) -> float:
    """ready − intended (s)."""
    return r.ready_s - r.intended_s


def schedule_lag(r: RequestRecord) -> float | None:
    """send − ready (s); None when the request was never sent."""
    return None if r.send_s is None else r.send_s - r.ready_s


def tpot(r: RequestRecord) -> float | None:
    """(E2E − TTFT) / (output tokens − 1) (s); None below 2 output tokens or on failure."""
    if not r.ok or r.ttft_s is None or r.output_tokens is None or r.output_tokens < 2:
        return None
    assert r.e2e_s is not None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def itl_samples(r: RequestRecord) -> list[float]:
    """Per-token gaps: for chunk i > 0 carrying k_i tokens, k_i samples of (t_i − t_{i−1}) / k_i.

    A fractional k (tokens spread evenly over chunks, see `spread_tokens`) adds round(k) samples,
    at least one.
    """
    out: list[float] = []
    tokens = r.chunk_tokens
    for i, gap in enumerate(chunk_gaps(r.chunk_times_s), 1):
        k = tokens[i] if i < len(tokens) and tokens[i] > 0 else 1.0
        out.extend([gap / k] * max(1, round(k)))
    return out


# --------------------------------------------------------------------------- many requests


class Window(BaseModel):
    """The measured window: first measured send to last measured end (s since run start)."""

    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return max(self.end_s - self.start_s, 1e-9)


def measured_window(records: Sequence[RequestRecord]) -> Window | None:
    sent = [r for r in records if r.send_s is not None]
    if not sent:
        return None
    start = min(r.send_s for r in sent if r.send_s is not None)
    end = max((r.end_s if r.end_s is not None else r.send_s) or start for r in sent)
    return Window(start_s=start, end_s=end)


def peak_output_tps(records: Iterable[RequestRecord], window: Window, bucket_s: float = 1.0) -> int:
    """The most output tokens in any `bucket_s` bucket of the window, per second.

    Each chunk's tokens fall in bucket floor((send + chunk time − window start) / bucket_s);
    peak = max over buckets of tokens / bucket_s. Windows shorter than a bucket give tokens
    over the window's length instead.
    """
    buckets: dict[int, float] = {}
    for r in records:
        if r.send_s is None:
            continue
        sent = r.sent_s if r.sent_s is not None else r.send_s
        for t, k in zip(r.chunk_times_s, r.chunk_tokens, strict=False):
            b = math.floor((sent + t - window.start_s) / bucket_s)
            buckets[b] = buckets.get(b, 0.0) + k
    if not buckets:
        return 0
    if window.duration_s < bucket_s:
        return round(sum(buckets.values()) / window.duration_s)
    return round(max(buckets.values()) / bucket_s)


def meets_slos(r: RequestRecord, slos: Mapping[str, float]) -> bool:
    """True when a successful request meets every SLO (milliseconds): `ttft_ms`, `tpot_ms`,
    `e2e_ms`, `itl_ms` (its largest per-token gap). A request with no TPOT (1 output token)
    meets a TPOT SLO, as it has no decode phase to miss it with."""
    if not r.ok:
        return False
    checks = {
        "ttft_ms": r.ttft_s,
        "tpot_ms": tpot(r),
        "e2e_ms": r.e2e_s,
        "itl_ms": max(itl_samples(r), default=None),
    }
    for key, limit_ms in slos.items():
        value = checks[key]
        if value is None:
            if key == "ttft_ms":
                return False
            continue
        if value * 1000.0 > limit_ms:
            return False
    return True


def summarize(
    records: Sequence[RequestRecord],
    *,
    percentiles: Sequence[float] = (50, 90, 99),
    slos: Mapping[str, float] | None = None,
) -> dict[str, float | int | None]:
    """The metrics of one load level over its measured requests.

    - `requests`, `errors`, `error_rate` = errors / requests.
    - `duration_s` = the measured window (first measured send to last measured end).
    - `request_throughput` = successful requests / window (req/s).
    - `output_throughput` = output tokens of successful requests / window (tokens/s).
    - `total_throughput` = (prompt + output tokens) / window (tokens/s; prompt tokens from
      usage, absent without it).
    - `peak_output_tps` = `peak_output_tps(...)` in 1 s buckets.
    - `goodput` = successful requests meeting every SLO / window (req/s); without SLOs, equal to
      `request_throughput`. `goodput_fraction` = those requests / all measured requests.
    - `<metric>_ms_p<q>`, `_mean`, `_max` for ttft, ttfc, tpot, itl, e2e, queue_wait, sched_lag,
      client_lag and connect (over the requests that opened a connection).
    - `tokens_counted` = 1 when any output-token count was counted rather than server usage.
    """
    measured = [r for r in records if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    window = measured_window(measured)
    dur = window.duration_s if window else None
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    slos = dict(slos or {})
    good = sum(1 for r in ok if meets_slos(r, slos))
    m: dict[str, float | int | None] = {
        "requests": len(measured),
        "errors": len(measured) - len(ok),
        "error_rate": (len(measured) - len(ok)) / len(measured) if measured else None,
        "duration_s": dur,
        "request_throughput": len(ok) / dur if dur else None,
        "output_throughput": out_tokens / dur if dur else None,
        "total_throughput": (out_tokens + sum(prompt)) / dur if dur and prompt else None,
        "peak_output_tps": peak_output_tps(ok, window) if window else None,
        "goodput": good / dur if dur else None,
        "goodput_fraction": good / len(measured) if measured else None,
        "output_tokens_mean": mean([float(r.output_tokens or 0) for r in ok]),
        "prompt_tokens_mean": mean([float(p) for p in prompt]),
        "tokens_counted": int(any(r.token_source == "counted" for r in ok)),
        **prefix_rates(ok),
    }
    series: dict[str, list[float]] = {
        "ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
        "ttfc": [r.ttfc_s for r in ok if r.ttfc_s is not None],
        "tpot": [x for r in ok if (x := tpot(r)) is not None],
        "itl": [x for r in ok for x in itl_samples(r)],
        "e2e": [r.e2e_s for r in ok if r.e2e_s is not None],
        "queue_wait": [queue_wait(r) for r in measured],
        "sched_lag": [x for r in measured if (x := schedule_lag(r)) is not None],
        "client_lag": [r.client_lag_s for r in measured if r.client_lag_s is not None],
        "connect": [r.connect_s for r in measured if r.connect_s is not None],
    }
    for name, values in series.items():
        m.update(spread_ms(name, values, percentiles))
    return m


def prefix_rates(ok: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Prefix-cache efficiency over successful requests (`metrale.prefix` for the block rule):

    - `prefix_hit_rate_ideal` = Σ ideal cached tokens / Σ ideal prompt tokens: the fraction of
      prompt tokens an unbounded perfect cache would have served, from the prompts in the order
      sent (the cache's state carries over from warm-up and earlier levels, as the server's does);
    - `prefix_hit_rate_server` = Σ cached tokens / Σ prompt tokens, from the usage of the
      requests whose usage reports `cached_tokens` (None when none does: the `/metrics`
      counters then give `server_prefix_hit_rate`, see `metrale.benchmarks.serve.telemetry`);
    - `prefix_cache_efficiency` = server / ideal (None when the ideal is 0: nothing to serve).
    """
    ideal = [(r.ideal_cached_tokens, r.ideal_prompt_tokens) for r in ok]
    ideal_hit = sum(h for h, n in ideal if h is not None and n)
    ideal_all = sum(n for h, n in ideal if h is not None and n)
    served = [(r.cached_tokens, r.prompt_tokens) for r in ok if r.cached_tokens is not None]
    server_all = sum(n or 0 for _, n in served)
    ideal_rate = ideal_hit / ideal_all if ideal_all else None
    server_rate = sum(c or 0 for c, _ in served) / server_all if server_all else None
    efficiency = server_rate / ideal_rate if server_rate is not None and ideal_rate else None
    return {
        "prefix_hit_rate_ideal": ideal_rate,
        "prefix_hit_rate_server": server_rate,
        "prefix_cache_efficiency": efficiency,
    }


def with_server_rate(
    level: Mapping[str, float | int | None], telemetry: Mapping[str, float | None]
) -> dict[str, float | None]:
    """A level's telemetry metrics; when no response reported `cached_tokens`, the server's
    hit rate is the `/metrics` counters' (`server_prefix_hit_rate`), and efficiency follows."""
    out = dict(telemetry)
    server = telemetry.get("server_prefix_hit_rate")
    ideal = level.get("prefix_hit_rate_ideal")
    if level.get("prefix_hit_rate_server") is None and server is not None:
        out["prefix_hit_rate_server"] = server
        out["prefix_cache_efficiency"] = server / float(ideal) if ideal else None
    return out


def spread_ms(
    name: str, values: Sequence[float], percentiles: Sequence[float]
) -> dict[str, float | None]:
    """`{name}_ms_p{q}` for each q, `{name}_ms_mean`, `{name}_ms_max`, from seconds."""
    out: dict[str, float | None] = {}
    for q in percentiles:
        p = percentile(values, q)
        out[f"{name}_ms_p{q_text(q)}"] = None if p is None else p * 1000.0
    avg = mean(values)
    out[f"{name}_ms_mean"] = None if avg is None else avg * 1000.0
    out[f"{name}_ms_max"] = max(values) * 1000.0 if values else None
    return out


def q_text(q: float) -> str:
    return str(int(q)) if float(q).is_integer() else str(q).replace(".", "_")
