"""report and plot from cell files (synthetic cells: no run needed)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.matrix.cellfile import CellResult, read_cells, write_cell
from metrale.matrix.plot import DPI, build_figure, plot_cells
from metrale.matrix.report import export_rows, render_report, report_table
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
    columns, rows = report_table(cells)
    assert columns == [
        "cell", "conc", "e2e (s)", "err", "rew",
        "setup (ms)", "generation (ms)", "scoring (µs)", "total (ms)",
    ]  # fmt: skip
    by_name = {r[0]: dict(zip(columns, r, strict=True)) for r in rows}
    assert list(by_name) == ["bwrap-r16", "bwrap-r16-c4", "subprocess-r16", "subprocess-r16-c4"]
    for c in cells:
        row = by_name[c.cell]
        assert row["conc"] == ("∞" if c.max_concurrent is None else str(c.max_concurrent))
        assert row["err"] == str(c.errors)
        for stage in ("setup (ms)", "generation (ms)", "scoring (µs)", "total (ms)"):
            if c.records:
                assert row[stage].count("(") == 1 and row[stage].count("–") == 1
    assert by_name["subprocess-r16-c4"]["generation (ms)"] == "-"
    md = render_report(cells)
    assert md.splitlines()[0].startswith("| cell ")
    assert "- subprocess-r16-c4: failed: RuntimeStartError: no sandbox" in md


def test_report_csv_columns_are_numbers(cells) -> None:  # type: ignore[no-untyped-def]
    rows = list(csv.DictReader(io.StringIO(render_report(cells, "csv"))))
    assert [r["cell"] for r in rows] == [c.cell for c in cells]
    for row, c in zip(rows, cells, strict=True):
        assert row["max_concurrent"] == ("" if c.max_concurrent is None else str(c.max_concurrent))
        assert float(row["errors"]) == c.errors
        if c.records:
            gen = sorted(c.stage("generation"))
            # the p50 of an even-sized sample: the mean of the two middle values
            assert float(row["generation_p50_s"]) == pytest.approx(
                (gen[len(gen) // 2 - 1] + gen[len(gen) // 2]) / 2
            )
            assert float(row["setup_p10_s"]) < float(row["setup_p90_s"])
            assert float(row["reward_mean"]) == pytest.approx(c.reward_mean)
        else:
            assert row["generation_p50_s"] == ""
    # every declared gsm8k metric is a column, as a number where measured
    assert {"error_rate", "retries", "total_p90_s", "e2e_s"} <= set(rows[0])
    assert rows[0]["error_rate"] == ""  # the synthetic cells carry no metric values


def test_report_json_is_the_same_rows(cells) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(render_report(cells, "json"))
    assert [r["cell"] for r in doc["cells"]] == [c.cell for c in cells]
    first = doc["cells"][0]
    assert first["max_concurrent"] is None and isinstance(first["total_p50_s"], float)
    assert doc["cells"][1]["max_concurrent"] == 4
    assert doc["cells"][3]["generation_p50_s"] is None and doc["cells"][3]["status"] == "failed"


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


@pytest.mark.parametrize(
    ("name", "magic"), [("x.svg", b"<?xml"), ("x.pdf", b"%PDF"), ("x.PNG", b"\x89PNG")]
)
def test_plot_format_follows_the_extension(cells, tmp_path: Path, name: str, magic: bytes) -> None:  # type: ignore[no-untyped-def]
    info = plot_cells(cells, tmp_path / name)
    assert info.path.read_bytes().startswith(magic)


def test_plot_refuses_an_unknown_extension(cells, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match=r"accepted: \.png, \.svg, \.pdf"):
        plot_cells(cells, tmp_path / "x.jpg")
    assert not (tmp_path / "x.jpg").exists()


def test_report_stage_columns_are_p50_with_p10_p90_of_the_cells_durations() -> None:
    """Literal durations whose percentiles are worked out by hand (linear interpolation: for
    five sorted values p10 sits 0.4 of the way from the first to the second, p90 0.6 of the
    way from the fourth to the fifth)."""
    cell = CellResult(
        cell="literal-r5", benchmark="gsm8k", runtime="none", rollouts=5, records=5,
        max_concurrent=2, e2e_s=12.345, errors=1, reward_mean=0.25, rewards=[0, 0, 0, 1],
        metrics={"error_rate": 0.2, "retries": 3, "not_declared": 1.5},
        durations={
            "setup": [0.002] * 5,
            "generation": [1.0, 2.0, 3.0, 4.0, 5.0],
            "scoring": [0.00005] * 5,
            "total": [100.0, 200.0, 300.0, 400.0, 500.0],
        },
    )  # fmt: skip
    columns, [row] = report_table([cell])
    assert columns == [
        "cell", "conc", "e2e (s)", "err", "rew",
        "setup (ms)", "generation (s)", "scoring (µs)", "total (s)",
    ]  # fmt: skip
    assert row == [
        "literal-r5", "2", "12.3", "1", "0.25",
        "2 (2–2)", "3 (1.4–4.6)", "50 (50–50)", "300 (140–460)",
    ]  # fmt: skip
    [exported] = export_rows([cell])
    assert (exported["generation_p10_s"], exported["generation_p50_s"]) == (
        pytest.approx(1.4),
        3.0,
    )
    assert exported["total_p90_s"] == pytest.approx(460.0)
    assert (exported["error_rate"], exported["retries"]) == (0.2, 3)
    assert "not_declared" not in exported  # the benchmark's declarations pick the columns
    [text_row] = list(csv.DictReader(io.StringIO(render_report([cell], "csv"))))
    assert (text_row["max_concurrent"], text_row["e2e_s"], text_row["retries"]) == (
        "2",
        "12.345",
        "3",
    )
    empty = CellResult(cell="e", benchmark="gsm8k", runtime="none", rollouts=0)
    _, [row] = report_table([empty])
    assert row == ["e", "∞", "-", "0", "-", "-", "-", "-", "-"]


def test_no_table_cell_prints_four_decimal_zeros() -> None:
    """The issue's own example: a 2.9 µs setup printed as 0.0000029 in a seconds column."""
    cell = CellResult(
        cell="tiny", benchmark="gsm8k", runtime="none", rollouts=3, records=3, e2e_s=0.0021,
        durations={"setup": [2.4e-6, 2.9e-6, 5.2e-6], "generation": [0.00091, 0.001, 0.0011],
                   "scoring": [6.606, 71.9, 94.7], "total": [6.61, 71.9, 94.7]},
    )  # fmt: skip
    columns, [row] = report_table([cell])
    text = " ".join(row)
    assert "0.000" not in text
    assert row[columns.index("setup (µs)")] == "2.9 (2.5–4.74)"
    assert row[columns.index("generation (ms)")] == "1 (0.928–1.08)"
    assert row[columns.index("scoring (s)")] == "71.9 (19.7–90.1)"


def test_report_shows_the_sandbox_durations_a_cell_has_as_run_does() -> None:
    """pool_start and setup_wait before setup, stop after scoring, when any cell has them (a
    cell without them shows `-`); a column whose tail is 300x its median moves up a unit."""
    stages = {
        "setup": [0.00044, 0.0008, 0.000899, 0.001, 0.29],
        "generation": [1.0, 2.0, 3.0, 4.0, 5.0],
        "scoring": [0.01] * 5,
        "total": [2.0, 3.0, 4.0, 5.0, 6.0],
    }
    pooled = CellResult(
        cell="bwrap-pool", benchmark="gsm8k", runtime="bwrap", rollouts=5, records=5,
        e2e_s=9.0, durations={**stages, "pool_start": [0.02] * 5, "setup_wait": [0.001] * 5,
                              "stop": [0.04, 0.04, 0.05, 0.06, 0.06]},
    )  # fmt: skip
    plain = CellResult(
        cell="none", benchmark="gsm8k", runtime="none", rollouts=5, records=5, e2e_s=8.0,
        durations=stages,
    )  # fmt: skip
    columns, rows = report_table([pooled, plain])
    assert columns == [
        "cell", "conc", "e2e (s)", "err", "rew", "pool_start (ms)", "setup_wait (ms)",
        "setup (ms)", "generation (s)", "scoring (ms)", "stop (ms)", "total (s)",
    ]  # fmt: skip
    assert rows[0][5:] == [
        "20 (20–20)", "1 (1–1)", "0.899 (0.584–174)", "3 (1.4–4.6)", "10 (10–10)",
        "50 (40–60)", "4 (2.4–5.6)",
    ]  # fmt: skip
    assert rows[1][5:7] == ["-", "-"] and rows[1][10] == "-"
    exported = export_rows([pooled, plain])
    assert exported[0]["pool_start_p50_s"] == 0.02 and exported[0]["stop_p90_s"] == 0.06
    assert exported[1]["pool_start_p50_s"] is None
    # without any sandboxed cell the table is the four stages only
    assert report_table([plain])[0][5:] == [
        "setup (ms)", "generation (s)", "scoring (ms)", "total (s)",
    ]  # fmt: skip
