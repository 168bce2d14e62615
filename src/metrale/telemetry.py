"""Server telemetry during a run: the runner's side of `metrale.endpoint.scrape`.

While a benchmark runs against a target, its `/metrics` page is sampled every 250 ms into
`telemetry.jsonl` in the run directory (one `TelemetryRow` a line: seconds since the run
started, wall time, the client's requests in flight where the benchmark says (serve), and the
vocabulary's values). A target without the page costs one GET and one note. At the end the run's
telemetry summary (`scrape.summarize` over the whole run: gauges' mean and max, counters' rates,
the server's prefix hit rate) joins the result's metrics and the summary's declared metrics,
without replacing what the benchmark reported itself (serve reports it per load level, through
`PluginHandle.telemetry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
from pydantic import BaseModel, ValidationError

from metrale.endpoint.client import Target
from metrale.endpoint.http import ConnectionPool
from metrale.endpoint.scrape import COUNTERS, GAUGES, Sample, Scraper
from metrale.errors import RecordWriteError, UsageError, data_lines
from metrale.plugin import BenchmarkResult, Metric
from metrale.rundir import RunArtifacts

logger = logging.getLogger(__name__)

TELEMETRY_FILE = "telemetry.jsonl"
INTERVAL_S = 0.25


class TelemetryRow(BaseModel):
    """One line of `telemetry.jsonl`."""

    t: float
    wall: float
    load: int | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_hit_rate: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None


def _gauge(name: str, what: str, unit: str = "requests") -> list[Metric]:
    return [
        Metric(f"server_{name}_{stat}", unit, None, stat="value",
               doc=f"{stat} of the server's {what} over the run's /metrics samples")
        for stat in ("mean", "max")
    ]  # fmt: skip


#: What the run's summary declares when the target served telemetry (stat `value`: one number
#: for the run, no sample to bootstrap).
METRICS: tuple[Metric, ...] = (
    *_gauge("requests_running", "requests being served"),
    *_gauge("requests_waiting", "queued requests"),
    *_gauge("kv_cache_usage", "KV-cache usage (0..1)", "fraction"),
    Metric("server_prefix_hit_rate", "fraction", "higher", stat="value",
           doc="the server's prefix-cache hits / queries over the run (/metrics counters)"),
    Metric("server_prompt_tokens_per_s", "tok/s", None, stat="value",
           doc="the server's prompt-token counter's increase / seconds"),
    Metric("server_generation_tokens_per_s", "tok/s", "higher", stat="value",
           doc="the server's generated-token counter's increase / seconds"),
    Metric("server_telemetry_samples", "samples", None, stat="value",
           doc="/metrics samples taken during the run"),
)  # fmt: skip


@contextlib.asynccontextmanager
async def sampling(
    target: Target,
    artifacts: RunArtifacts,
    *,
    origin: float,
    load: Callable[[], int | None],
    on_note: Callable[[str], None],
    interval_s: float = INTERVAL_S,
) -> AsyncIterator[Scraper]:
    """Sample the target's `/metrics` for the body of the `with`; always stop and close."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    pool = ConnectionPool(target.base_url, headers)
    failed = False

    def write(sample: Sample) -> None:
        nonlocal failed
        if failed:
            return
        row = TelemetryRow(t=sample.t - origin, wall=sample.wall, load=sample.load,
                           **{k: sample.values.get(k) for k in (*GAUGES, *COUNTERS)})  # fmt: skip
        try:
            artifacts.append_line(TELEMETRY_FILE, row)
        except RecordWriteError as exc:
            failed = True
            on_note(f"server telemetry: {exc}; sampling goes on unrecorded")

    scraper = Scraper(pool, interval_s=interval_s, on_sample=write, on_note=on_note, load=load)
    task = asyncio.create_task(scraper.run())
    try:
        yield scraper
    finally:
        task.cancel()
        results = await asyncio.gather(task, return_exceptions=True)
        if isinstance(results[0], Exception):  # a bug in sampling must not end the run
            logger.warning("server telemetry failed: %s", results[0], exc_info=results[0])
        await pool.close()


def merge(final: BenchmarkResult, summary: dict[str, float | None]) -> None:
    """Add the run's telemetry summary to the result and its summary, the benchmark's own
    values (serve's per level) first."""
    if not summary:
        return
    for key, value in summary.items():
        final.metrics.setdefault(key, value)
    measured = final.measured
    if measured is None:
        return
    for key, value in summary.items():
        measured.metrics.setdefault(key, value)
    declared = {d.name for d in measured.declared}
    measured.declared += [m.declaration() for m in METRICS if m.name not in declared]


def read_telemetry(run_dir: Path) -> list[TelemetryRow]:
    """The run directory's telemetry rows (bounded, regular file only); [] without the file;
    a line that is not a row is skipped (the file may come from anyone)."""
    path = run_dir / TELEMETRY_FILE
    if not path.exists() and not path.is_symlink():
        return []
    rows: list[TelemetryRow] = []
    try:
        for line in data_lines(path, "telemetry file"):
            try:
                rows.append(TelemetryRow.model_validate(orjson.loads(line)))
            except (orjson.JSONDecodeError, ValidationError):
                continue
    except UsageError as exc:
        logger.warning("%s: unreadable: %s", path, exc)
    return rows
