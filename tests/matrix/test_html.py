"""`metrale report --html`: the page of a real sweep, a serve run and an agent's transcripts,
rendered by headless Chromium (Debian's `chromium`), which must report no page error and
fetch nothing."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from metrale.agent import Agent, AgentConfig
from metrale.fmt import duration_text
from metrale.matrix.cellfile import CellResult, read_cells
from metrale.matrix.drilldown import drilldown_html
from metrale.matrix.html import axis, render_html
from metrale.rollout import RolloutRecord
from tests.conftest import run_cli, start_sim

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium: apt-get install chromium (scripts/test.sh does)"
)


def render(page: Path, tmp_path: Path, fragment: str = "") -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and every console line Chromium logged (an
    uncaught exception, console.error, or a fetch the page's CSP refused all log one)."""
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'chromium'}",
         "--dump-dom", page.as_uri() + fragment],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def body_data(dom: str, name: str) -> str:
    found = re.search(rf'<body[^>]* data-{name}="([^"]*)"', dom)
    assert found, f"no data-{name} on <body>: the page's script did not finish"
    return html.unescape(found.group(1))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    with start_sim("--ttft", "0.01", "--error-rate", "0.3", "--seed", "3") as sim:
        proc = run_cli([
            "matrix", "gsm8k", "--runtime", "none,subprocess", "--rollouts", "12",
            "--max-concurrent", "none,3", "--target", sim.url, "--model", sim.model,
            "--no-preflight", "--retries", "0", "--out", str(out), "--quiet",
        ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@needs_chromium
def test_a_sweep_page_renders_with_no_page_error(sweep: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    proc = run_cli(["report", str(sweep), "--html", str(page)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| cell ")  # the table still goes to stdout
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing to fetch
    dom, console = render(page, tmp_path, "#selftest")
    assert console == []
    cells = read_cells(sweep)
    # four stage panels, and each cell's two server-telemetry panels (the sim serves /metrics)
    assert body_data(dom, "rendered") == str(4 + 2 * len(cells))
    tips = json.loads(body_data(dom, "tips"))
    assert len(tips) == 4 * len(cells)  # every cell has data in every stage panel
    # hovering a point names its cell and its p10/p50/p90
    generation = tips[len(cells) : 2 * len(cells)]
    for cell, tip in zip(cells, generation, strict=True):
        assert tip.startswith(f"{cell.cell} ({cell.runtime})")
        assert re.search(r"p50 [\d.]+ (µs|ms|s)\np10 [\d.]+ (µs|ms|s)\np90 ", tip), tip
    # the drill-down names the errors the endpoint injected, with their messages
    assert sum(c.errors for c in cells) > 0
    assert "errors (" in dom and "http_500" in dom and "slowest " in dom


@needs_chromium
def test_a_serve_run_page_draws_its_curves(tmp_path: Path) -> None:
    run_dir = tmp_path / "serve"
    with start_sim("--output-tokens", "6", "--itl", "0.002") as sim:
        proc = run_cli([
            "run", "serve", "--target", sim.url, "--model", sim.model, "--no-preflight",
            "--load", "sweep", "--requests", "none", "--duration-s", "0.6", "--sweep-levels",
            "2", "--sweep-concurrency", "4", "--max-tokens", "6", "--out", str(run_dir),
            "--quiet",
        ])  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    page = tmp_path / "serve.html"
    assert run_cli(["report", str(run_dir), "--html", str(page)]).returncode == 0
    dom, console = render(page, tmp_path)
    assert console == []
    assert "TTFT (ms)" in dom and "TPOT (ms)" in dom and "goodput (req/s)" in dom
    assert dom.count("<polyline") >= 5  # p50 and p90 of TTFT and TPOT, and goodput
    assert "achieved throughput (req/s)" in dom


def test_transcripts_show_in_the_drilldown(tmp_path: Path) -> None:
    """An agent's transcript, written by the agent's own writer, read back into the page."""
    run_dir = tmp_path / "run"
    (run_dir / "transcripts").mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    agent = Agent(None, None, AgentConfig(), transcript=run_dir / "transcripts" / "0.jsonl")  # type: ignore[arg-type]
    agent.add({"role": "user", "content": "build a <webserver>"})
    call = {"function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    agent.add({"role": "assistant", "content": "", "tool_calls": [call]})
    record = RolloutRecord(id="r0", benchmark="agentic_webserver", index=0, started_at=0.0,
                           total_s=12.5, reward=0.0, turns=2)  # fmt: skip
    (run_dir / "rollouts.jsonl").write_text(record.model_dump_json() + "\n")
    cell = CellResult(cell="run", benchmark="agentic_webserver", runtime="bwrap", records=1)
    text = drilldown_html(cell, run_dir)
    assert "agent transcripts (1)" in text and "rollout 0 · reward 0 · 2 turns" in text
    assert "build a &lt;webserver&gt;" in text  # escaped, not markup
    assert '→ bash({"cmd": "ls"})'.replace('"', "&quot;") in text


def test_a_cell_without_records_still_makes_a_page(tmp_path: Path) -> None:
    error = "RuntimeStartError: no sandbox </script>"
    failed = CellResult(
        cell="x", benchmark="gsm8k", runtime="none", rollouts=4, status="failed", error=error
    )
    page = render_html(tmp_path, [failed])
    assert "RuntimeStartError: no sandbox &lt;/script&gt;" in page
    assert page.count("</script>") == 2  # the data block and the script: nothing injected


def test_axis_is_log_only_across_decades_and_ticks_cover_the_values() -> None:
    linear = axis([10.1], [10.5])
    assert not linear["log"] and linear["lo"] == 0 and linear["hi"] >= 10.5
    # 10.5 / 5 ticks = 2.1 a step: the next 1-2-5 step is 5
    assert [t for t, _ in linear["ticks"]] == [0, 5, 10, 15]
    log = axis([2e-6], [0.15], duration_text)
    assert log["log"] and log["lo"] == 1e-6 and log["hi"] == 1.0
    # six decades: a tick per power of ten, labelled in its own unit
    assert log["ticks"] == [
        [1e-6, "1 µs"], [1e-5, "10 µs"], [1e-4, "100 µs"], [1e-3, "1 ms"], [0.01, "10 ms"],
        [0.1, "100 ms"], [1.0, "1 s"],
    ]  # fmt: skip
    few = axis([0.02], [1.5], duration_text)  # two decades: 1-2-5 ticks
    assert [t for t, _ in few["ticks"]] == pytest.approx(
        [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10]
    )
