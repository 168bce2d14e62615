"""Issue 21 item 9: the HTML page survives any text. Data embedded in the page's <script>
element is encoded so that no string (a run directory, a runtime type, a cell name) can end
the element, open a comment in it or start another script; Chromium proves the chart script
still ran."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from metrale.matrix.cellfile import read_cells, write_cell
from metrale.matrix.html import render_html
from tests.conftest import run_cli
from tests.matrix.helpers import make_cell
from tests.matrix.test_html import body_data, needs_chromium, render

#: sequences that end, comment or re-open a script element, and JS line terminators
HOSTILE = ["<!--<script>", "</script><script>alert(1)</script>", "<!--", "--!>", "\u2028\u2029"]


def _sweep(tmp_path: Path, text: str) -> Path:
    """A sweep directory whose path, runtime types and cell names carry `text`."""
    out = tmp_path / f"sweep{text.replace('/', '')}"
    for i, runtime in enumerate(("none", f"bwrap{text}")):
        cell = make_cell(f"c{i}", runtime=runtime, seed=i)
        write_cell(out, cell.model_copy(update={"cell": f"c{i}{text.replace('/', '')}"}))
    return out


@pytest.mark.parametrize("text", HOSTILE)
def test_no_text_ends_or_comments_the_page_data(tmp_path: Path, text: str) -> None:
    out = _sweep(tmp_path, text)
    page = render_html(out, read_cells(out))
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, re.DOTALL)
    data = next(s for s in scripts if s.startswith("{"))  # the JSON, ended where HTML ends it
    assert "<" not in data and ">" not in data and "&" not in data
    assert "\u2028" not in data and "\u2029" not in data
    parsed = json.loads(data)
    assert f"bwrap{text}" in parsed["runtimes"]  # the same value, only encoded


@needs_chromium
def test_the_chart_script_runs_whatever_the_names_hold(tmp_path: Path) -> None:
    out = _sweep(tmp_path, "<!--<script>")
    page = tmp_path / "page.html"
    proc = run_cli(["report", str(out), "--html", str(page)])
    assert proc.returncode == 0, proc.stderr
    dom, console = render(page, tmp_path, "#selftest")
    assert console == []
    assert body_data(dom, "rendered") == "4"  # the script ran: four stage panels drawn
    tips = json.loads(body_data(dom, "tips"))
    assert any("bwrap<!--<script>" in tip for tip in tips)  # the text shown as text
