"""The live view: rich on a terminal (a real run against `metrale sim`), plain lines off one,
nothing with --quiet."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

from metrale.endpoint.client import Target
from metrale.live import PlainView, RichView, make_view
from metrale.plugin import BenchmarkResult, LogLine, Status
from metrale.runner import RunRequest, run
from tests.conftest import run_cli, start_sim

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    """A stream that says it is a terminal, so the runner picks the rich view."""

    def isatty(self) -> bool:
        return True


def text_of(view: RichView, now: float) -> str:
    buf = io.StringIO()
    from rich.console import Console

    Console(file=buf, width=160, force_terminal=False, color_system=None).print(view.render(now))
    return buf.getvalue()


def test_the_view_is_chosen_by_the_stream(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(make_view(Terminal()), RichView)
    assert isinstance(make_view(io.StringIO()), PlainView)
    assert isinstance(make_view(io.StringIO(), terminal=True), RichView)
    quiet = make_view(None)
    quiet.snapshot(BenchmarkResult(summary="x"))  # writes nowhere, raises nothing
    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(make_view(Terminal()), PlainView)


def test_bar_rate_eta_and_the_snapshot_numbers() -> None:
    clock = [1000.0]
    view = RichView(io.StringIO(), clock=lambda: clock[0])
    view.phase("rollouts")
    view.progress(0, 100)  # the rate is measured from here: 0 done at t = 1000 s
    clock[0] = 1020.0
    view.snapshot(
        BenchmarkResult(
            phase="rollouts", done=40, total=100, elapsed_s=20.0, errors=2, retries=3,
            reward_mean=0.4567, running_p50_s={"generation": 0.373, "total": 1.5}, turns=17,
        )
    )  # fmt: skip
    text = text_of(view, now=1020.0)  # 40 done in 20 s: 2/s, 60 left: 30 s
    assert "2/s" in text and "ETA 0:30" in text
    assert "rollouts" in text and "40/100 40%" in text
    assert "2/s" in text and "ETA 0:30" in text and "elapsed 0:20" in text
    assert "errors 2 · retries 3 · reward 0.457" in text
    assert "generation p50 373 ms · total p50 1.5 s · turns 17" in text
    view.close()


def test_serve_shows_its_level_and_ttft_tpot() -> None:
    view = RichView(io.StringIO())
    snap = BenchmarkResult(
        phase="concurrency 4", done=5, total=None, level="concurrency 4", in_flight=4, errors=0,
        running_p50_s={"ttft": 0.012, "tpot": 0.0031},
    )  # fmt: skip
    view.snapshot(snap)
    text = text_of(view, now=0.0)
    assert "level concurrency 4 · in flight 4 · errors 0 · ttft p50 12 ms · tpot p50 3.1 ms" in text
    assert "ETA -:--" in text  # no total: no ETA


def test_logs_print_above_the_view_and_close_leaves_the_last_frame() -> None:
    out = io.StringIO()
    view = RichView(out)
    view.phase("rollouts")
    view.log(LogLine(level="warn", message="cap lowered to 512"))
    view.snapshot(BenchmarkResult(status=Status.COMPLETED, phase="done", done=8, total=8))
    view.close()
    plain = ANSI.sub("", out.getvalue())
    assert "warning: cap lowered to 512" in plain
    assert "8/8 100%" in plain


def test_a_real_run_on_a_terminal_draws_the_view(tmp_path: Path) -> None:
    term = Terminal()
    with start_sim("--ttft", "0.05", "--output-tokens", "4") as sim:
        request = RunRequest(
            benchmark="gsm8k",
            params={"rollouts": 80, "max_concurrent": 4, "max_tokens": 4},
            target=Target(base_url=sim.url, model=sim.model),
            out=tmp_path / "run",
            preflight=False,
            progress=term,
        )
        outcome = asyncio.run(run(request))
    assert outcome.exit_code == 0
    plain = ANSI.sub("", term.getvalue())
    assert "80/80 100%" in plain
    assert re.search(r"generation p50 [\d.]+ ms", plain), plain[-2000:]
    assert "errors 0 · retries 0" in plain
    assert "ETA" in plain and "reward" in plain


def test_quiet_prints_no_progress(tmp_path: Path) -> None:
    with start_sim() as sim:
        args = ["run", "gsm8k", "--target", sim.url, "--rollouts", "4", "--no-preflight"]
        loud = run_cli([*args, "--out", str(tmp_path / "a")])
        quiet = run_cli([*args, "--out", str(tmp_path / "b"), "--quiet"])
    assert loud.returncode == quiet.returncode == 0
    assert "[rollouts]" in loud.stderr
    assert "[rollouts]" not in quiet.stderr and "[load]" not in quiet.stderr
    assert "run directory:" in quiet.stderr  # where the results are is not progress
    assert quiet.stdout.splitlines()[0].startswith("e2e")
