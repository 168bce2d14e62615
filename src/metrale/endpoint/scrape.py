"""Server telemetry: what a serving engine says about itself on its Prometheus `/metrics` page,
sampled while a run loads it, in one vocabulary whatever the engine.

**The vocabulary** (`NAMES` maps each engine's names to it, the table in docs/usage.md's
"Server telemetry"): `running` and `waiting` requests, `kv_cache_usage` (0..1) and the engine's
own `prefix_hit_rate` are gauges, read as they are; `prefix_queries`, `prefix_hits` (prompt
tokens looked up in and served by the prefix cache), `prompt_tokens` and `generation_tokens`
are counters, read as their increase over a window.

A name seen under several label sets (one per model or engine) is summed, except the
fractions (`kv_cache_usage`, `prefix_hit_rate`), which are averaged. Other names are ignored.

**Sampling** (`Scraper`): every `interval_s` (250 ms) one GET of `/metrics` beside the target's
`/v1`, on its own connection. A target without the page (connection refused, 404, any non-200),
or whose page has none of the names above, gets one note and no more requests; lines that are
not Prometheus text get one note and are skipped; the run goes on in every case.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from metrale.endpoint.http import ConnectionPool, HttpConnectionError, HttpProtocolError

logger = logging.getLogger(__name__)

#: metric name -> vocabulary key (module docstring); the first name present wins for a key.
NAMES: dict[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:gpu_prefix_cache_queries_total": "prefix_queries",
    "vllm:gpu_prefix_cache_hits_total": "prefix_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:cache_hit_rate": "prefix_hit_rate",
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:generation_tokens_total": "generation_tokens",
    "tgi_batch_current_size": "running",
    "tgi_queue_size": "waiting",
    "tgi_request_input_length_sum": "prompt_tokens",
    "tgi_request_generated_tokens_sum": "generation_tokens",
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:kv_cache_usage_ratio": "kv_cache_usage",
    "llamacpp:prompt_tokens_total": "prompt_tokens",
    "llamacpp:tokens_predicted_total": "generation_tokens",
}
GAUGES = ("running", "waiting", "kv_cache_usage", "prefix_hit_rate")
COUNTERS = ("prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens")
_FRACTIONS = ("kv_cache_usage", "prefix_hit_rate")
_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?")
#: A page larger than this is not read (a real engine's is tens of KB).
MAX_PAGE_BYTES = 8 * 1024 * 1024


def parse_page(text: str) -> tuple[dict[str, float], int]:
    """(vocabulary key -> value, lines that were not Prometheus text) of one `/metrics` page."""
    per_name: dict[str, list[float]] = {}
    garbage = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            garbage += 1
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            garbage += 1
            continue
        if m.group(1) in NAMES and math.isfinite(value):
            per_name.setdefault(m.group(1), []).append(value)
    values: dict[str, float] = {}
    for name, key in NAMES.items():
        if key in values or name not in per_name:
            continue
        seen = per_name[name]
        values[key] = sum(seen) / len(seen) if key in _FRACTIONS else sum(seen)
    return values, garbage


@dataclass(frozen=True)
class Sample:
    """One scrape: `t` (perf_counter), `wall` (epoch s), the values read, the client's load."""

    t: float
    wall: float
    values: Mapping[str, float]
    load: int | None = None


class Scraper:
    """Samples `/metrics` until cancelled (module docstring); `samples` keeps every one."""

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        interval_s: float = 0.25,
        on_sample: Callable[[Sample], None] = lambda s: None,
        on_note: Callable[[str], None] = lambda text: None,
        load: Callable[[], int | None] = lambda: None,
        timeout_s: float = 2.0,
    ) -> None:
        self.pool = pool
        self.path = pool.path_prefix.removesuffix("/v1") + "/metrics"
        self.interval_s = interval_s
        self.on_sample, self.on_note, self.load = on_sample, on_note, load
        self.timeout_s = timeout_s
        self.samples: list[Sample] = []
        self._noted: set[str] = set()

    def _note(self, kind: str, text: str) -> None:
        if kind not in self._noted:
            self._noted.add(kind)
            self.on_note(text)

    async def _page(self) -> str | None:
        """The page's text, or None (noted) when there is none to read."""
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await self.pool.get(self.path, under_base=False)
                try:
                    body = await resp.read(MAX_PAGE_BYTES)
                finally:
                    resp.release()
        except (HttpConnectionError, HttpProtocolError, TimeoutError, OSError) as exc:
            self._note("unreachable", f"server telemetry: GET {self.path} failed ({exc})")
            return None
        if resp.status != 200:
            self._note("status", f"server telemetry: GET {self.path} answered HTTP {resp.status}")
            return None
        return body.decode("utf-8", "replace")

    async def run(self) -> None:
        """Sample on a fixed schedule; stop (after its note) when the target has no telemetry."""
        tick = time.perf_counter()
        while True:
            text = await self._page()
            if text is None:
                if not self.samples:
                    return  # no page at all: one note, no more requests
            else:
                values, garbage = parse_page(text)
                if garbage:
                    self._note("garbage", f"server telemetry: {garbage} line(s) of {self.path} "
                               "are not Prometheus text; skipped")  # fmt: skip
                if not values and not self.samples:
                    text = f"server telemetry: {self.path} has none of the names metrale reads"
                    self._note("unknown", text + " (vLLM, SGLang, TGI, llama-server); none taken")
                    return
                if values:
                    sample = Sample(time.perf_counter(), time.time(), values, self.load())
                    self.samples.append(sample)
                    self.on_sample(sample)
            tick += self.interval_s
            await asyncio.sleep(max(0.0, tick - time.perf_counter()))

    def summary(self, start: float, end: float) -> dict[str, float | None]:
        return summarize(self.samples, start, end)


def summarize(samples: Sequence[Sample], start: float, end: float) -> dict[str, float | None]:
    """Telemetry over [start, end] (perf_counter), as metrics; {} without samples in it.

    - `server_<gauge>_mean`, `_max` over the samples inside the window, for `requests_running`,
      `requests_waiting`, `kv_cache_usage`;
    - a counter's increase: from the last sample at or before `start` (else the first inside)
      to the first at or after `end` (else the last inside); `server_prompt_tokens_per_s` and
      `server_generation_tokens_per_s` = increase / the time between those two samples;
    - `server_prefix_hit_rate` = Δ prefix hits / Δ prefix queries (else the mean of the
      engine's own hit-rate gauge);
    - `server_telemetry_samples` = samples inside the window.
    """
    inside = [s for s in samples if start <= s.t <= end]
    if not inside:
        return {}
    before = [s for s in samples if s.t <= start]
    after = [s for s in samples if s.t >= end]
    first = before[-1] if before else inside[0]
    last = after[0] if after else inside[-1]
    out: dict[str, float | None] = {"server_telemetry_samples": float(len(inside))}
    for key, name in (("running", "requests_running"), ("waiting", "requests_waiting"),
                      ("kv_cache_usage", "kv_cache_usage")):  # fmt: skip
        seen = [s.values[key] for s in inside if key in s.values]
        if seen:
            out[f"server_{name}_mean"] = sum(seen) / len(seen)
            out[f"server_{name}_max"] = max(seen)

    def delta(key: str) -> float | None:
        a, b = first.values.get(key), last.values.get(key)
        return None if a is None or b is None or b < a else b - a

    span = last.t - first.t
    for key in ("prompt_tokens", "generation_tokens"):
        d = delta(key)
        if d is not None and span > 0:
            out[f"server_{key}_per_s"] = d / span
    hits, queries = delta("prefix_hits"), delta("prefix_queries")
    if hits is not None and queries:
        out["server_prefix_hit_rate"] = hits / queries
    else:
        rates = [s.values["prefix_hit_rate"] for s in inside if "prefix_hit_rate" in s.values]
        if rates:
            out["server_prefix_hit_rate"] = sum(rates) / len(rates)
    return out
