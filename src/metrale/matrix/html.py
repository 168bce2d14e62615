"""`metrale report DIR --html FILE`: one self-contained page for a sweep or a run directory.

The page holds the report table, an interactive per-stage chart (a point per cell at p50, a
whisker p10–p90; hovering shows the cell and its three numbers; a click opens the cell), a
drill-down per cell to its rollouts (`drilldown`), and the curves a benchmark draws of its
own run directory (`plugin.CurvesRuns`: serve's latency against throughput).

Self-contained means no URL is loaded: the style and script (`assets/`) are inlined, the data
is JSON in the page, and a Content-Security-Policy of `default-src 'none'` makes the browser
refuse any fetch (and report it) should one ever creep in. Every number is formatted here, in
Python, by `metrale.fmt`; the script only places what it is given.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from metrale import __version__
from metrale.errors import UsageError
from metrale.fmt import duration_text, number_text
from metrale.matrix.cellfile import CellResult
from metrale.matrix.drilldown import cell_run_dir, drilldown_html
from metrale.matrix.plot import LOG_SPAN, Panel, bar_label, panels_for
from metrale.matrix.report import failure_notes, has_stages, report_table
from metrale.plugin import CurvesRuns, Status, get_benchmark
from metrale.telemetry import read_telemetry

logger = logging.getLogger(__name__)

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"


def write_html(directory: Path, cells: Sequence[CellResult], out: Path) -> Path:
    """Write the page for `cells` (read from `directory`) to `out`; return `out`."""
    page = render_html(directory, cells)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def render_html(directory: Path, cells: Sequence[CellResult]) -> str:
    if not cells:
        raise UsageError(f"{directory}: no cells to report")
    ids = {c.cell: f"cell-{i}" for i, c in enumerate(cells)}
    run_dirs = {c.cell: cell_run_dir(c, directory) for c in cells}
    runtimes = list(dict.fromkeys(c.runtime for c in cells))
    curves = [
        {"host": f"curves-{i}", "panels": panels}
        for i, c in enumerate(cells)
        if (panels := _curves(c, run_dirs[c.cell]))
    ]
    try:
        stage_panels = [_panel_data(p, cells, ids) for p in panels_for(cells)]
    except UsageError:  # nothing plottable (every cell failed before a rollout)
        stage_panels = []
    data = {"panels": stage_panels, "runtimes": runtimes, "curves": curves}
    first = cells[0]
    title = f"metrale · {first.benchmark}" + (f" · {first.model}" if first.model else "")
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<div class="meta">{escape(str(directory))} · {len(cells)} cell(s) · target '
        f"{escape(first.target or '-')} · metrale {escape(first.metrale_version or __version__)}"
        f" · page written {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}</div>",
        "<h2>table</h2>",
        _table_html(cells, ids),
    ]
    body += [f'<p class="err">{escape(n)}</p>' for n in failure_notes(cells)]
    if stage_panels:
        legend = "".join(
            f'<span><i style="background:{_colour(i)}"></i>{escape(r)}</span>'
            for i, r in enumerate(runtimes)
        )
        body += [
            "<h2>per stage: p50, whisker p10–p90</h2>"
            if has_stages(cells)
            else "<h2>per metric: value, whisker p10–p90 of its sample</h2>",
            f'<div class="legend">runtime: {legend}</div>',
            '<p class="note">hover a point for its cell and numbers; click it to open the cell '
            "below. r = rollouts, c = max concurrent.</p>",
            '<div class="charts" id="stage-charts"></div>',
        ]
    body.append("<h2>cells</h2>")
    for i, c in enumerate(cells):
        host = (
            f'<div class="charts" id="curves-{i}"></div>'
            if any(g["host"] == f"curves-{i}" for g in curves)
            else ""
        )
        body.append(
            f'<details id="{ids[c.cell]}"><summary>{escape(c.cell)} · {c.status} · '
            f"{c.records} {escape(c.unit)}s · {c.errors} errors</summary>{host}"
            f"{drilldown_html(c, run_dirs[c.cell])}</details>"
        )
    return _page(title, "\n".join(body), data)


def _page(title: str, body: str, data: dict[str, Any]) -> str:
    assets = resources.files("metrale.matrix").joinpath("assets")
    css = assets.joinpath("report.css").read_text(encoding="utf-8")
    js = assets.joinpath("report.js").read_text(encoding="utf-8")
    payload = script_json(data)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        f"<title>{escape(title)}</title>\n<style>\n{css}</style></head>\n<body>\n{body}\n"
        '<div id="tip"></div>\n'
        f'<script type="application/json" id="report-data">{payload}</script>\n'
        f"<script>\n{js}</script>\n</body></html>\n"
    )


#: What must not appear raw inside a <script> element: `<` (`</script`, `<!--`, `<script`
#: end or re-nest it), `>` and `&` (for good measure), and U+2028/2029 (line ends to old JS).
_SCRIPT_UNSAFE: dict[str, str | int | None] = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def script_json(data: Any) -> str:
    """`data` as JSON that is safe inside a <script> element whatever its strings hold: each
    unsafe character is written as its `\\uXXXX` escape, so the parsed value is the same and
    no sequence of the text can end the element or open a comment in it."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return text.translate(str.maketrans(_SCRIPT_UNSAFE))


def _table_html(cells: Sequence[CellResult], ids: dict[str, str]) -> str:
    columns, rows = report_table(cells)
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        f'<tr class="cellrow{" failed" if c.status == Status.FAILED else ""}" '
        f'data-cell="{ids[c.cell]}">' + "".join(f"<td>{escape(str(x))}</td>" for x in row) + "</tr>"
        for c, row in zip(cells, rows, strict=True)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _panel_data(panel: Panel, cells: Sequence[CellResult], ids: dict[str, str]) -> dict[str, Any]:
    fmt = duration_text if panel.seconds else number_text
    points = []
    for c in cells:
        pt = panel.point(c)
        entry: dict[str, Any] = {"id": ids[c.cell], "cell": c.cell, "runtime": c.runtime,
                                 "label": bar_label(c).replace("\n", " ") or c.cell}  # fmt: skip
        if pt is None:
            entry.update(p50=None, p10=None, p90=None, tip=f"{c.cell}: no data")
        else:
            p50, p10, p90 = pt
            entry.update(
                p50=p50, p10=p10, p90=p90,
                tip=f"{c.cell} ({c.runtime})\np50 {fmt(p50)}\np10 {fmt(p10)}\np90 {fmt(p90)}",
            )  # fmt: skip
        points.append(entry)
    lows = [p["p10"] for p in points if p["p10"] is not None]
    highs = [p["p90"] for p in points if p["p90"] is not None]
    # a metric panel's unit is the start of its axis label (`matrix.plot._metric_panel`)
    title = panel.title if panel.seconds else f"{panel.title} ({panel.ylabel.partition(':')[0]})"
    return {"title": title, "points": points, "y": axis(lows, highs, fmt)}


def axis(
    lows: Sequence[float], highs: Sequence[float], fmt: Any = number_text, log_ok: bool = True
) -> dict[str, Any]:
    """A y axis for values within [min(lows), max(highs)]: log when they span more than
    `LOG_SPAN` (and are positive), else linear from 0 (or the lowest value, when negative);
    ticks at 1-2-5 steps, labelled by `fmt`."""
    lo = min(lows, default=0.0)
    hi = max(highs, default=1.0)
    if log_ok and lo > 0 and hi / lo > LOG_SPAN:
        bottom, top = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
        first, last = round(math.log10(bottom)), round(math.log10(top))
        decades = last - first
        # 1-2-5 ticks over a few decades; over more, powers of ten (every other past eight),
        # so that labels never overlap
        subs = (1, 2, 5) if decades <= 3 else (1,)
        every = 2 if decades > 8 else 1
        ticks = [
            m * 10**e
            for e in range(first, last + 1, every)
            for m in subs
            if bottom <= m * 10**e <= top
        ]
        return {"log": True, "lo": bottom, "hi": top, "ticks": [[t, fmt(t)] for t in ticks]}
    bottom = min(0.0, lo)
    top = hi if hi > bottom else bottom + 1.0
    step = _nice_step((top - bottom) / 5)
    top = math.ceil(top / step) * step
    n = round((top - bottom) / step)
    ticks = [bottom + i * step for i in range(n + 1)]
    return {"log": False, "lo": bottom, "hi": top, "ticks": [[t, fmt(t)] for t in ticks]}


def _nice_step(raw: float) -> float:
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def _curves(cell: CellResult, run_dir: Path | None) -> list[dict[str, Any]]:
    """The benchmark's own curves of the cell's run directory, then its server telemetry's,
    axes and labels filled in."""
    if run_dir is None:
        return []
    try:
        bench: object = get_benchmark(cell.benchmark)  # a class; staticmethods meet CurvesRuns
    except UsageError as exc:
        logger.info("%s: no curves of its own: %s", cell.cell, exc)
        return []
    own = bench.run_curves(run_dir) if isinstance(bench, CurvesRuns) else []
    panels = []
    for panel in [*own, *telemetry_curves(run_dir)]:
        xs = [p[0] for s in panel["series"] for p in s["points"]]
        ys = [p[1] for s in panel["series"] for p in s["points"]]
        if not xs:
            continue
        panels.append({**panel, "x": axis(xs, xs, log_ok=False), "y": axis(ys, ys)})
    return panels


def telemetry_curves(run_dir: Path) -> list[dict[str, Any]]:
    """The run's server telemetry (`telemetry.jsonl`) against time: the client's requests in
    flight beside the server's running and waiting ones, and its KV-cache usage."""
    rows = read_telemetry(run_dir)

    def series(key: str, name: str, unit: str, dashed: bool = False) -> dict[str, Any]:
        pts = []
        for r in rows:
            y = getattr(r, key)
            if y is not None:
                tip = f"{name} {number_text(y)} {unit}\nt {number_text(r.t)} s"
                pts.append([r.t, float(y), tip])
        return {"name": name, "dashed": dashed, "points": pts}

    x_label = "seconds since the run started"
    panels: list[dict[str, Any]] = [
        {"title": "requests: client load and server (/metrics)", "x_label": x_label,
         "mark": None, "series": [series("load", "client in flight", "requests", True),
                                  series("running", "server running", "requests"),
                                  series("waiting", "server waiting", "requests")]},
        {"title": "server KV-cache usage (/metrics)", "x_label": x_label, "mark": None,
         "series": [series("kv_cache_usage", "KV-cache usage", "")]},
    ]  # fmt: skip
    return [p for p in panels if any(s["points"] for s in p["series"])]


def _colour(i: int) -> str:
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]  # fmt: skip
    return palette[i % len(palette)]
