"""report and plot from cell files (synthetic cells: no run needed)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.matrix.cellfile import CellResult, read_cells, write_cell
from metrale.matrix.plot import DPI, build_figure, plot_cells
from metrale.matrix.report import COLUMNS, render_report
from tests.matrix.helpers import make_cell


@pytest.fixture
def cells(tmp_path: Path):  # type: ignore[no-untyped-def]
    for i, (rt, conc) in enumerate([("bwrap", None), ("bwrap", 4), ("subprocess", None)]):
        name = f"{rt}-r16" + (f"-c{conc}" if conc else "")
        write_cell(tmp_path, make_cell(name, runtime=rt, rollouts=16, max_concurrent=conc, seed=i))
    failed = make_cell(
        "subprocess-r16-c4",
        runtime="subprocess",
        rollouts=16,
        finished=0,
        max_concurrent=4,
        status="failed",
        error="RuntimeStartError: no sandbox",
    )
    write_cell(tmp_path, failed)
    return read_cells(tmp_path)


def test_report_rows_are_the_files_numbers(cells) -> None:  # type: ignore[no-untyped-def]
    text = render_report(cells, "csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == COLUMNS
    by_name = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in rows[1:]}
    assert list(by_name) == ["bwrap-r16", "bwrap-r16-c4", "subprocess-r16", "subprocess-r16-c4"]
    for c in cells:
        row = by_name[c.cell]
        assert row["conc"] == ("∞" if c.max_concurrent is None else str(c.max_concurrent))
        assert row["err"] == str(c.errors)
        for stage in ("setup", "generation", "scoring", "total"):
            if c.records:
                assert row[stage].count("(") == 1 and row[stage].count("–") == 1
    assert by_name["subprocess-r16-c4"]["generation"] == "-"
    md = render_report(cells)
    assert md.splitlines()[0].startswith("| cell ")
    assert "- subprocess-r16-c4: failed: RuntimeStartError: no sandbox" in md


def test_plot_has_four_panels_grouped_by_runtime(cells, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.image

    fig = build_figure(cells)
    assert [ax.get_title() for ax in fig.axes] == [
        "setup", "generation", "scoring", "total (first start to last end)"
    ]  # fmt: skip
    gen = fig.axes[1]
    assert len(gen.patches) == 3  # one bar per cell with data; the failed one is labelled
    assert gen.get_xticklabels()[0].get_text() == "r16\nc∞"
    colours = [p.get_facecolor() for p in gen.patches]
    assert colours[0] == colours[1] != colours[2]  # bwrap, bwrap, subprocess
    info = plot_cells(cells, tmp_path / "out" / "sweep.png")
    image = matplotlib.image.imread(info.path)
    assert image.shape[:2] == (info.height_px, info.width_px)
    w, h = fig.get_size_inches()
    assert (info.width_px, info.height_px) == (round(w * DPI), round(h * DPI))
    assert info.width_px >= 900 and info.height_px >= 800


def test_log_scale_when_a_panel_spans_decades(tmp_path: Path) -> None:
    fast = make_cell("none-r16", rollouts=16)
    slow = make_cell("none-r16-c1", rollouts=16, max_concurrent=1, scale=1000)
    fig = build_figure([fast, slow])
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
    assert build_figure([fast]).axes[0].get_yscale() == "linear"


def test_plot_wants_a_png(cells, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match="PNG"):
        plot_cells(cells, tmp_path / "x.pdf")


def test_report_stage_columns_are_p50_with_p10_p90_of_the_cells_durations() -> None:
    """Literal durations whose percentiles are worked out by hand (linear interpolation: for
    five sorted values p10 sits 0.4 of the way from the first to the second, p90 0.6 of the
    way from the fourth to the fifth)."""
    cell = CellResult(
        cell="literal-r5", benchmark="gsm8k", runtime="none", rollouts=5, records=5,
        max_concurrent=2, e2e_s=12.345, errors=1, reward_mean=0.25, rewards=[0, 0, 0, 1],
        durations={
            "setup": [0.002] * 5,
            "generation": [1.0, 2.0, 3.0, 4.0, 5.0],
            "scoring": [0.00005] * 5,
            "total": [100.0, 200.0, 300.0, 400.0, 500.0],
        },
    )  # fmt: skip
    [row] = list(csv.reader(io.StringIO(render_report([cell], "csv"))))[1:]
    assert row == [
        "literal-r5", "2", "12.35", "1", "0.250",
        "0.002 (0.002–0.002)", "3.000 (1.400–4.600)", "0.000050 (0.000050–0.000050)",
        "300 (140–460)",
    ]  # fmt: skip
    empty = CellResult(cell="e", benchmark="gsm8k", runtime="none", rollouts=0)
    [row] = list(csv.reader(io.StringIO(render_report([empty], "csv"))))[1:]
    assert row == ["e", "∞", "-", "0", "-", "-", "-", "-", "-"]
