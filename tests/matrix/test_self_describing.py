"""Results describe themselves: a cell file and summary.json carry a schema version and every
metric's declaration, and report, compare, plot and the HTML page read those, not the benchmark
installed now.

`tests/fixtures/sweep-v1` was written by main at 6c5ae96 (before files carried either), with its
outputs beside it (`golden/`): read as schema 1, with today's declarations as the fallback, it
reads exactly as it did. The same sweep written again by this metrale then reads the same even
when the installed benchmark's declarations change.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from metrale.matrix.cellfile import read_cell, read_cells, write_cell
from metrale.matrix.compare import compare_paths, render_comparison
from metrale.matrix.html import render_html
from metrale.matrix.plot import panels_for
from metrale.matrix.report import render_report
from metrale.plugin import SCHEMA_VERSION, get_benchmark
from tests.conftest import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sweep-v1"
GOLDEN = FIXTURE / "golden"
SWEEPS = ("gsm8k", "gsm8k-after", "serve")


def _page_data(html: str) -> str:
    """The page without its inlined stylesheet and script (assets, not results) and the
    minute it was written."""
    html = re.sub(r"page written [0-9: -]+ UTC", "page written -", html)
    html = re.sub(r"<style>.*?</style>", "", html, flags=re.S)
    return re.sub(r"<script>\n.*?</script>", "", html, flags=re.S)


def outputs(root: Path) -> dict[str, str]:
    """Everything the golden holds, rendered from the sweep under `root`."""
    found: dict[str, str] = {}
    for sweep in ("gsm8k", "serve"):
        cells = read_cells(root / sweep)  # cwd is `root`: the page names the sweep as given
        for style in ("markdown", "plain", "csv", "json"):
            found[f"{sweep}.report.{style}"] = render_report(cells, style) + "\n"
        found[f"{sweep}.html"] = _page_data(render_html(Path(sweep), cells))
        found[f"{sweep}.panels"] = "".join(f"{p.title}\t{p.ylabel}\n" for p in panels_for(cells))
    result = compare_paths(root / "gsm8k", root / "gsm8k-after")
    for style in ("plain", "csv"):
        found[f"compare.{style}"] = render_comparison(result, style) + "\n"
    return found


def golden() -> dict[str, str]:
    found = {p.name: p.read_text() for p in GOLDEN.iterdir()}
    return {k: _page_data(v) if k.endswith(".html") else v for k, v in found.items()}


@pytest.fixture
def fixture_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture sweep in a scratch directory (cwd there: cells name their run directories
    relative to where the sweep ran)."""
    root = tmp_path / "sweep"
    for sweep in SWEEPS:
        shutil.copytree(FIXTURE / sweep, root / sweep)
    monkeypatch.chdir(root)
    return root


def rewritten(root: Path) -> Path:
    """The sweep written again by this metrale, as `matrix` writes a cell."""
    for sweep in SWEEPS:
        for path in sorted((root / sweep).glob("*.json")):
            write_cell(path.parent, read_cell(path))
    return root


def change_installed_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every metric of the installed gsm8k and serve in another unit, the other direction."""
    for name in ("gsm8k", "serve"):
        bench = get_benchmark(name)
        declared = bench.metrics

        def changed(self: object, declared: object = declared) -> list[object]:
            flip = {"lower": "higher", "higher": "lower", None: None}
            return [
                dataclasses.replace(m, unit=f"new-{m.unit}", better=flip[m.better])
                for m in declared(self)  # type: ignore[operator]
            ]

        monkeypatch.setattr(bench, "metrics", changed)


def test_an_old_sweep_reads_as_it_did(fixture_copy: Path) -> None:
    assert outputs(fixture_copy) == golden()


def test_a_rewritten_sweep_reads_the_same(fixture_copy: Path) -> None:
    assert outputs(rewritten(fixture_copy)) == golden()


def test_a_sweep_reads_with_its_own_declarations_not_the_installed_ones(
    fixture_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewritten(fixture_copy)
    change_installed_declarations(monkeypatch)
    assert get_benchmark("serve")().metrics()[0].unit.startswith("new-")  # the change holds
    assert outputs(fixture_copy) == golden()


def test_a_cell_file_carries_its_version_and_declarations(fixture_copy: Path) -> None:
    rewritten(fixture_copy)
    data = json.loads((fixture_copy / "serve" / "max_concurrency=1.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    declared = {d["name"]: d for d in data["declared"]}
    assert declared["ttft_ms_p50"] == {
        **declared["ttft_ms_p50"],
        "unit": "ms",
        "better": "lower",
        "stat": "p50",
        "column": True,
    }
    assert declared["request_throughput"]["better"] == "higher"


def test_an_old_file_is_read_as_version_1(fixture_copy: Path) -> None:
    cell = read_cell(fixture_copy / "gsm8k" / "none-r6-c3.json")
    assert cell.schema_version == 1
    assert "generation" in {d.name for d in cell.declared}  # today's fallback


def _newer(path: Path) -> None:
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))


def test_a_newer_cell_file_is_one_line_and_exit_2(fixture_copy: Path) -> None:
    path = fixture_copy / "gsm8k" / "none-r6-c3.json"
    _newer(path)
    for argv in (
        ["report", "gsm8k"],
        ["compare", "gsm8k", "gsm8k-after"],
        ["compare", str(path), str(path)],
    ):
        proc = run_cli(argv, cwd=fixture_copy)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert str(path.name) in lines[0] and f"schema version {SCHEMA_VERSION + 1}" in lines[0]


def test_a_newer_summary_json_is_one_line_and_exit_2(tmp_path: Path, sim) -> None:
    run = tmp_path / "run"
    proc = run_cli(["run", "gsm8k", "--target", sim.url, "--rollouts", "2", "--out", str(run)])
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads((run / "summary.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert {"name", "unit", "better", "stat"} <= set(data["declared"][0])
    _newer(run / "summary.json")
    proc = run_cli(["compare", str(run), str(run)])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "summary.json" in lines[0], proc.stderr
    assert f"schema version {SCHEMA_VERSION + 1}" in lines[0]
