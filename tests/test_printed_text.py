"""Issue 21 item 6: text from a task, an image build, a model or a run directory never
controls the user's terminal. Each print point gets text carrying an OSC 52 clipboard write,
a window title, a clear-screen and a bidi override, and must show it, not emit it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from metrale.cli import main
from metrale.live import PlainView, RichView
from metrale.matrix.cellfile import write_cell
from metrale.matrix.execute import cell_line
from metrale.plugin import BenchmarkResult, LogLine, Status
from tests.conftest import run_cli, start_sim
from tests.matrix.helpers import make_cell

#: an OSC 52 clipboard write, a window title, a clear screen, a C1 CSI, a bidi override
EVIL = "\x1b]52;c;cm0gLXJmIH4=\x07 \x1b]0;owned\x1b\\ \x1b[2J\x1b[H \x9b31m \u202egnp.exe \r\x08"
#: none of these may reach a terminal from text metrale did not write
OBEYED = ("\x1b]", "\x1b[2J", "\x1b[H", "\x07", "\x9b", "\u202e", "\r", "\x08")


def assert_inert(text: str) -> None:
    found = [seq for seq in OBEYED if seq in text]
    assert not found, f"{found!r} reached the output: {text!r}"


def test_report_and_compare_show_cell_errors_and_names_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for where in (a, b):
        write_cell(where, make_cell("none-r64", runtime=f"rt{EVIL}"))
        evil = make_cell("evil", status="failed", error=f"image build failed: {EVIL}")
        write_cell(where, evil.model_copy(update={"cell": f"evil{EVIL}"}))
    for argv in (
        ["report", str(a)],
        ["report", str(a), "--csv"],
        ["report", str(a), "--json"],
        ["compare", str(a), str(b)],
        ["compare", str(a), str(b), "--csv"],
    ):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code in (0, 1), err
        assert_inert(out)
        assert_inert(err)
        assert "\\x1b]52" in out + err or "\\u001b]52" in out + err  # shown, escaped
    # the JSON export is still the same data, only written safely
    main(["report", str(a), "--json"])
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert any(c["error"] == f"image build failed: {EVIL}" for c in cells)


def test_an_error_line_from_a_run_directory_is_inert(tmp_path: Path) -> None:
    with start_sim() as sim:
        run_dir = tmp_path / "run"
        proc = run_cli([
            "run", "gsm8k", "--target", sim.url, "--no-preflight", "--quiet", "--out",
            str(run_dir), "--rollouts", "2", "--max-tokens", "4",
        ], timeout=120)  # fmt: skip
        assert proc.returncode in (0, 1), proc.stderr
        info = json.loads((run_dir / "run.json").read_text())
        (run_dir / "run.json").write_text(json.dumps({**info, "model": f"m{EVIL}"}))
        proc = run_cli(["run", "--resume", str(run_dir), "--model", "other"], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "conflicts" in proc.stderr
    assert_inert(proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1  # a \r or \n inside cannot split it


def test_list_shows_a_plugin_descriptor_inert(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import metrale.plugin
    from metrale.plugin import Descriptor, get_benchmark

    base = get_benchmark("gsm8k")
    evil = type("Evil", (base,), {"descriptor": Descriptor(id="evil", name=EVIL, summary=EVIL)})
    monkeypatch.setattr(metrale.plugin, "discover", lambda: {"evil": evil})
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "evil" in out
    assert_inert(out)


def _snapshot(status: Status = Status.RUNNING) -> BenchmarkResult:
    return BenchmarkResult(status=status, phase=f"rollouts{EVIL}", done=1, total=4, summary=EVIL)


def test_the_plain_view_shows_log_lines_and_progress_inert() -> None:
    stream = io.StringIO()
    view = PlainView(stream, interval_s=0.0)
    view.phase(f"build{EVIL}")
    view.log(LogLine(level="error", message=f"image build output: {EVIL}"))
    view.snapshot(_snapshot(Status.FAILED))
    view.close()
    text = stream.getvalue()
    assert "image build output" in text and "\\x1b]52" in text
    assert_inert(text)


def test_the_live_view_shows_log_lines_inert_and_parses_no_markup() -> None:
    stream = io.StringIO()
    view = RichView(stream, refresh_s=0.0)
    view.phase(f"build{EVIL}")
    view.log(LogLine(level="warn", message=f"[bold red]not markup[/] {EVIL}"))
    view.snapshot(_snapshot())
    view.close()
    text = stream.getvalue()
    assert "[bold red]not markup[/]" in text  # rich's markup is shown, not parsed
    # rich writes its own styles (ESC [ ... m); nothing else of the injected text may remain
    for seq in ("\x1b]52", "\x1b]0;", "\x1b[2J", "\x1b[H", "\x07", "\x9b", "\u202e"):
        assert seq not in text, f"{seq!r} reached the terminal"


def test_a_sweeps_progress_line_is_inert() -> None:
    cell = make_cell("evil", status="failed", error=f"sandbox said {EVIL}")
    line = cell_line(cell.model_copy(update={"cell": f"c{EVIL}"}))
    assert "FAILED" in line
    assert_inert(line)


def test_the_sanitiser_keeps_ordinary_text() -> None:
    from metrale.fmt import safe_text

    plain = "ok: 12 ms · µs – ∞ 日本語\ttab\nnext line"
    assert safe_text(plain) == plain
    assert safe_text(plain, lines=False) == plain.replace("\t", "\\x09").replace("\n", "\\x0a")
    assert_inert(safe_text(EVIL))


def _on_a_terminal(argv: list[str]) -> bytes:
    """What `metrale ARGV` writes to a terminal (a pseudo-terminal)."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "metrale", *argv],
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=follower,
        )
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == 0, out
        return out
    finally:
        os.close(leader)


def test_exec_output_is_inert_on_a_terminal_and_exact_into_a_pipe() -> None:
    script = r"printf 'a\033]52;c;cm0gLXJm\007b\033]0;owned\007c\033[2Jd\n'"
    argv = ["exec", "--runtime", "subprocess", "--", "sh", "-c", script]
    shown = _on_a_terminal(argv).decode()
    assert "a" in shown and "d" in shown
    assert_inert(shown.replace("\r\n", "\n"))  # the terminal's own line ends aside
    piped = run_cli(argv, timeout=60)
    assert piped.returncode == 0 and "\x1b]52;c;" in piped.stdout  # data, untouched
