"""Server telemetry during a run: `/metrics` sampled every 250 ms or less into telemetry.jsonl,
summarised per run and per serve level, and a target without it (no page, a 404, garbage,
unknown names) gets one note while the run goes on."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metrale import runner
from metrale.endpoint.client import Target
from metrale.endpoint.sim import SimConfig, SimServer
from metrale.matrix.cellfile import cell_from_run_dir
from metrale.matrix.html import render_html, telemetry_curves
from metrale.telemetry import TELEMETRY_FILE, read_telemetry


def run_serve(config: SimConfig, out: Path, page: str | None = None, **params: Any) -> Any:
    """A serve run in-process against an in-process sim; `page` replaces its /metrics text."""

    async def main() -> Any:
        server = SimServer(config)
        if page is not None:

            async def metrics(request: web.Request) -> web.Response:
                return web.Response(text=page)

            server._metrics = metrics  # type: ignore[method-assign]
        url = await server.start()
        try:
            request = runner.RunRequest(
                benchmark="serve", params={"ignore_eos": False, **params},
                target=Target(base_url=url, model="metrale-sim"), out=out, preflight=False,
                progress=None,
            )  # fmt: skip
            result = await runner.run(request)
            return result, server
        finally:
            await server.stop()

    return asyncio.run(main())


def test_a_loaded_server_is_sampled_every_250_ms_and_summarised(tmp_path: Path) -> None:
    # 4 slots, each request 0.2 s: concurrency 8 keeps 4 running and 4 waiting
    config = SimConfig(max_running=4, ttft_s=0.2, output_tokens=2, prefix_cache_tokens=100_000)
    result, _ = run_serve(config, tmp_path / "run", concurrency=8, requests=40,
                               max_tokens=2, shared_prefix_tokens=64)  # fmt: skip
    assert result.exit_code == 0
    rows = read_telemetry(tmp_path / "run")
    assert len(rows) >= 6
    gaps = [b.t - a.t for a, b in itertools.pairwise(rows)]
    assert sorted(gaps)[len(gaps) // 2] <= 0.25 + 0.05  # a 250 ms schedule (a loaded machine
    # may stretch one gap, not the schedule)
    assert max(r.running or 0 for r in rows) == 4
    assert max(r.waiting or 0 for r in rows) >= 3
    assert any(r.load == 8 for r in rows)  # the client's load, aligned with the server's
    m = result.result.metrics
    assert m["server_requests_running_max"] == 4
    assert 0 < m["server_requests_running_mean"] <= 4
    assert m["server_telemetry_samples"] >= 6
    # per level too (levels.json), and the summary declares what it holds
    levels = json.loads((tmp_path / "run" / "levels.json").read_text())
    assert levels["levels"][0]["metrics"]["server_requests_running_max"] == 4
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    declared = {d["name"] for d in summary["declared"]}
    assert {"server_requests_running_mean", "server_kv_cache_usage_max"} <= declared
    assert not [log for log in result.result.logs if "telemetry" in log.message]


def test_without_cached_tokens_in_usage_the_metrics_counters_give_the_server_rate(
    tmp_path: Path,
) -> None:
    config = SimConfig(prefix_cache_tokens=100_000, usage=False, ttft_s=0.3)
    result, server = run_serve(config, tmp_path / "run", concurrency=2, requests=8,
                               shared_prefix_tokens=64, input_tokens=16)  # fmt: skip
    m = result.result.metrics
    c = server.model.counters
    assert m["prefix_hit_rate_server"] == pytest.approx(c.prefix_hits / c.prefix_queries)
    assert m["prefix_cache_efficiency"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize(
    ("page", "config", "needle"),
    [
        (None, SimConfig(metrics_names="none"), "HTTP 404"),
        ("foo_total 3\nbar 1\n", SimConfig(), "none of the names"),
        ("<html>\nvllm:num_requests_running 1\n}}}\n", SimConfig(), "not Prometheus text"),
    ],
    ids=["404", "unknown-names", "garbage"],
)
def test_no_telemetry_is_one_note_and_the_run_goes_on(
    tmp_path: Path, page: str | None, config: SimConfig, needle: str
) -> None:
    config.ttft_s = 0.1  # long enough for several samples
    result, _ = run_serve(config, tmp_path / "run", page=page, concurrency=2, requests=10)
    assert result.exit_code == 0 and result.result.metrics["requests"] == 10
    notes = [log.message for log in result.result.logs if "telemetry" in log.message]
    assert len(notes) == 1 and needle in notes[0]
    if needle == "not Prometheus text":
        assert len(read_telemetry(tmp_path / "run")) >= 2  # the good line is still read
    else:
        assert not (tmp_path / "run" / TELEMETRY_FILE).exists()


def test_the_html_report_draws_the_telemetry_against_time_beside_the_load(tmp_path: Path) -> None:
    config = SimConfig(max_running=2, ttft_s=0.15, output_tokens=2, prefix_cache_tokens=10_000)
    run_serve(config, tmp_path / "run", concurrency=4, requests=16, max_tokens=2)
    panels = telemetry_curves(tmp_path / "run")
    titles = [p["title"] for p in panels]
    assert titles == ["requests: client load and server (/metrics)",
                      "server KV-cache usage (/metrics)"]  # fmt: skip
    series = {s["name"]: s["points"] for s in panels[0]["series"]}
    assert max(p[1] for p in series["server running"]) == 2
    assert max(p[1] for p in series["client in flight"]) == 4
    # one time axis: each point's x is its row's t
    rows = read_telemetry(tmp_path / "run")
    assert [p[0] for p in series["server running"]] == [r.t for r in rows]
    page = render_html(tmp_path / "run", [cell_from_run_dir(tmp_path / "run")])
    assert "client in flight" in page and "server KV-cache usage" in page


def test_a_run_without_telemetry_draws_no_telemetry_panel(tmp_path: Path) -> None:
    run_serve(SimConfig(metrics_names="none"), tmp_path / "run", concurrency=2, requests=4)
    assert telemetry_curves(tmp_path / "run") == []
    assert "client in flight" not in render_html(
        tmp_path / "run", [cell_from_run_dir(tmp_path / "run")]
    )
