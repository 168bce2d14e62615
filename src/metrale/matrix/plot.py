"""The sweep figure: one panel per stage, a bar per cell at p50 with a p10–p90 whisker.

For a benchmark without stages (serve) the panels are its declared table columns
(`Metric.column`, as the cells' files declare them): a bar at the metric's value, the whisker
p10–p90 of its sample.

Cells are grouped by runtime (one colour each, gaps between groups) so that a glance says where
rollouts are fastest. A panel whose values span more than `LOG_SPAN` (p90 max / p10 min) uses a
log scale. matplotlib is imported here only, and drawn with the Agg canvas, never pyplot: no
display, no process-wide state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from metrale.errors import UsageError
from metrale.matrix.cellfile import CellResult, read_cells
from metrale.matrix.report import declared_metrics, seconds_text
from metrale.plugin import SUMMARY_STAGES, Metric
from metrale.stats import Spread

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: A panel switches to a log axis when its largest p90 exceeds its smallest p10 this many times.
LOG_SPAN = 20.0
DPI = 100
PANEL_TITLES = {
    "setup": "setup",
    "generation": "generation",
    "scoring": "scoring",
    "total": "total (first start to last end)",
}


@dataclass(frozen=True)
class PlotInfo:
    path: Path
    width_px: int
    height_px: int
    panels: list[str]


def _matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "plotting needs matplotlib: pip install 'metrale[plot]' (or matplotlib)"
        ) from None


def bar_label(cell: CellResult) -> str:
    """The part of a cell's identity that its runtime group does not already say."""
    parts = [cell.tier] if cell.tier else []
    if cell.rollouts is not None:
        parts.append(f"r{cell.rollouts}")
        parts.append("c∞" if cell.max_concurrent is None else f"c{cell.max_concurrent}")
    parts += [f"{k}={v}" for k, v in _swept_params(cell).items()]
    return "\n".join(parts)


def _swept_params(cell: CellResult) -> dict[str, object]:
    """Parameters that appear in the cell's name, i.e. the ones the sweep varied."""
    parts = cell.cell.split("-")
    return {k: v for k, v in cell.params.items() if any(p.startswith(f"{k}=") for p in parts)}


@dataclass(frozen=True)
class Panel:
    """One panel: a title, a tick formatter, and per cell (value, p10, p90) or None."""

    title: str
    ylabel: str
    seconds: bool
    point: Callable[[CellResult], tuple[float, float, float] | None]


def _stage_panel(stage: str) -> Panel:
    def point(c: CellResult) -> tuple[float, float, float] | None:
        s = Spread.of(c.stage(stage))
        if s.p50 is None or s.p10 is None or s.p90 is None:
            return None
        return s.p50, s.p10, s.p90

    return Panel(PANEL_TITLES[stage], "duration: p50, whisker p10–p90", True, point)


def _metric_panel(m: Metric) -> Panel:
    def point(c: CellResult) -> tuple[float, float, float] | None:
        value = c.metrics.get(m.name)
        sample = [x for x in c.sample(m.name) if isinstance(x, int | float)]
        if value is None:
            return None
        s = Spread.of(sorted(sample))
        lo = s.p10 if s.p10 is not None else float(value)
        hi = s.p90 if s.p90 is not None else float(value)
        return float(value), min(lo, float(value)), max(hi, float(value))

    return Panel(m.name, f"{m.unit}: value, whisker p10–p90 of its sample", False, point)


def _pass_panel(key: str) -> Panel:
    """A dataset's pass@1 or pass@k (`key` 1 or "k"), whiskers p10–p90 over its tasks."""

    def point(c: CellResult) -> tuple[float, float, float] | None:
        value = c.metrics.get(f"pass_at_{key}")
        k = 1 if key == "1" else int(c.metrics.get("attempts") or 1)
        per_task = sorted(x for t in c.per_task if (x := t.pass_at(k)) is not None)
        if value is None or not per_task:
            return None
        s = Spread.of(per_task)
        lo, hi = s.p10 if s.p10 is not None else value, s.p90 if s.p90 is not None else value
        return float(value), min(lo, float(value)), max(hi, float(value))

    ylabel = "mean over tasks, whisker p10–p90 of the tasks'"
    return Panel(f"pass@{key}", ylabel, False, point)


def panels_for(cells: Sequence[CellResult]) -> list[Panel]:
    """Stages where the cells have them (and a dataset's pass@1 and pass@k when a cell ran
    one); else the benchmark's declared table columns."""
    if any(c.stage(s) for c in cells for s in SUMMARY_STAGES):
        dataset = [_pass_panel("1"), _pass_panel("k")] if any(c.per_task for c in cells) else []
        return [*(_stage_panel(s) for s in SUMMARY_STAGES), *dataset]
    metrics = [m for m in declared_metrics(cells) if m.column]
    if not metrics:
        raise UsageError("nothing to plot: the cells have no stage durations and no columns")
    return [_metric_panel(m) for m in metrics]


def build_figure(cells: Sequence[CellResult]) -> Figure:
    """The figure for `cells` (not saved): 2 x 2 panels, setup, generation, scoring, total
    (or one per declared column, two columns wide)."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    runtimes = list(dict.fromkeys(c.runtime for c in sorted(cells, key=CellResult.sort_key)))
    ordered = sorted(cells, key=lambda c: (runtimes.index(c.runtime), c.sort_key()))
    palette = [f"C{i % 10}" for i in range(len(runtimes))]
    colour = {r: palette[i] for i, r in enumerate(runtimes)}
    xs: list[float] = []
    x = 0.0
    for i, c in enumerate(ordered):
        if i and c.runtime != ordered[i - 1].runtime:
            x += 0.8  # a gap between runtime groups
        xs.append(x)
        x += 1.0

    panels = panels_for(ordered)
    n_rows = (len(panels) + 1) // 2
    panel_w = max(4.5, 0.5 * len(ordered) + 1.5)
    fig = Figure(figsize=(2 * panel_w + 0.5, 4.25 * n_rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(n_rows, 2, squeeze=False).flatten())
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes, panels, strict=False):
        points = [panel.point(c) for c in ordered]
        for xi, c, pt in zip(xs, ordered, points, strict=True):
            if pt is None:
                ax.text(xi, 0.02, "failed" if c.status == "failed" else "no data", rotation=90,
                        transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                        fontsize=9, color="C3")  # fmt: skip
                continue
            mid, lo, hi = pt
            ax.bar(xi, mid, width=0.8, color=colour[c.runtime], edgecolor="0.2", linewidth=0.5)
            ax.errorbar(xi, mid, yerr=[[mid - lo], [hi - mid]],
                        fmt="none", ecolor="black", elinewidth=1, capsize=4)  # fmt: skip
        lows = [pt[1] for pt in points if pt is not None and pt[1] > 0]
        highs = [pt[2] for pt in points if pt is not None]
        if lows and highs and max(highs) / min(lows) > LOG_SPAN:
            ax.set_yscale("log")
            ax.set_ylim(bottom=min(lows) / 2)
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_formatter(NullFormatter())
        if panel.seconds:
            ax.yaxis.set_major_formatter(FuncFormatter(seconds_text))
        log = " (log scale)" if ax.get_yscale() == "log" else ""
        ax.set_title(panel.title + log, fontsize=12, fontweight="bold")
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.set_xticks(xs, [bar_label(c) for c in ordered], fontsize=8)
        ax.grid(axis="y", which="major", alpha=0.3)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    if any(c.rollouts is not None for c in ordered):  # a benchmark with runtimes: say which
        handles = [Patch(facecolor=colour[r], edgecolor="0.2", label=r) for r in runtimes]
        fig.legend(
            handles=handles, title="runtime", loc="outside lower center", ncols=len(runtimes)
        )
    first = ordered[0] if ordered else None
    model = f" · {first.model}" if first and first.model else ""
    bench = first.benchmark if first else ""
    legend = " · r = rollouts, c = max concurrent" if first and first.rollouts else ""
    fig.suptitle(f"{bench}{model} · {len(ordered)} cells{legend}",
                 fontsize=13)  # fmt: skip
    return fig


#: What `-o` may end in, and the format matplotlib writes for it.
FORMATS: dict[str, str] = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def figure_format(out: Path) -> str:
    """The format of `out` by its extension (png, svg or pdf), or a UsageError naming them."""
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        accepted = ", ".join(FORMATS)
        raise UsageError(
            f"-o {out}: cannot tell the format from its extension; accepted: {accepted}"
        )
    return fmt


def plot_cells(cells: Sequence[CellResult], out: Path) -> PlotInfo:
    """Draw `cells` into `out`: a PNG, SVG or PDF by its extension."""
    if not cells:
        raise UsageError("nothing to plot: no cells")
    fmt = figure_format(out)
    fig = build_figure(cells)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=fmt, dpi=DPI)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    width, height = fig.canvas.get_width_height()
    return PlotInfo(out, width, height, [ax.get_title() for ax in fig.axes if ax.get_visible()])


def plot_dir(directory: Path, out: Path) -> PlotInfo:
    """Plot the cell files of a `metrale matrix` output directory."""
    return plot_cells(read_cells(directory), out)
