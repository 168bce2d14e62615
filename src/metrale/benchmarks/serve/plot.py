"""The latency–throughput curve of a serve run: TTFT and TPOT (p50, p90) and goodput against the
achieved request throughput of each load level, the knee (peak goodput) marked.

Reads `levels.json` from a serve run directory. matplotlib is imported here only, drawn with the
Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrale.errors import UsageError, read_data_file

if TYPE_CHECKING:
    from metrale.benchmarks.serve.params import ServeLevels

logger = logging.getLogger(__name__)


def plot_serve(directory: Path, out: Path) -> Path:
    """Draw the curve of `directory` into the PNG `out`; return its path."""
    from metrale.benchmarks.serve.params import LEVELS_FILE, ServeLevels

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("plotting needs matplotlib: pip install 'metrale[plot]'") from None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    raw = read_data_file(directory / LEVELS_FILE, "serve levels file")
    try:
        levels = ServeLevels.model_validate_json(raw)
    except ValueError as exc:
        raise UsageError(f"{directory / LEVELS_FILE} is not a serve levels file: {exc}") from None
    points = sorted(
        (lv for lv in levels.levels if lv.metrics.get("request_throughput")),
        key=lambda lv: float(lv.metrics["request_throughput"] or 0.0),
    )
    if not points:
        raise UsageError(f"{directory}: no load level completed a request; nothing to plot")
    x = [float(lv.metrics["request_throughput"] or 0.0) for lv in points]
    knee = next((i for i, lv in enumerate(points) if lv.index == levels.knee), None)

    fig = Figure(figsize=(17 if levels.tiers else 13, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4 if levels.tiers else 3)
    for ax, metric, title in (
        (axes[0], "ttft", "TTFT (ms)"),
        (axes[1], "tpot", "TPOT (ms)"),
    ):
        for q, style in (("p50", "o-"), ("p90", "s--")):
            ys = [lv.metrics.get(f"{metric}_ms_{q}") for lv in points]
            ax.plot(x, [float("nan") if y is None else y for y in ys], style, label=q)
        ax.set_title(title)
        ax.set_ylabel("ms")
    good = [float(lv.metrics.get("goodput") or 0.0) for lv in points]
    axes[2].plot(x, good, "o-", color="tab:green", label="goodput")
    axes[2].plot(x, x, ":", color="grey", label="goodput = throughput")
    slo_text = ", ".join(f"{k} ≤ {v:g}" for k, v in levels.slos.items()) or "no SLO"
    axes[2].set_title(f"goodput (req/s; {slo_text})")
    for ax in axes[:3]:
        ax.set_xlabel("achieved throughput (req/s)")
        ax.grid(alpha=0.3)
        if knee is not None:
            ax.axvline(x[knee], color="tab:red", alpha=0.5, linestyle="--", label="knee")
        ax.legend(fontsize=8)
    for i, lv in enumerate(points):
        axes[2].annotate(lv.label, (x[i], good[i]), fontsize=7, alpha=0.7,
                         textcoords="offset points", xytext=(3, 3))  # fmt: skip
    if levels.tiers:
        _attainment_axes(axes[3], levels)
    fig.suptitle(f"serve: {directory.name}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def attainment_points(levels: ServeLevels, tier: str) -> list[tuple[float, float, bool, str]]:
    """(load, attainment, passed, label) of each level that judged `tier`, by load."""
    out = []
    for lv in levels.levels:
        load = next((x for x in (lv.lanes, lv.concurrency, lv.rate) if x is not None), None)
        outcome = lv.tiers.get(tier)
        if load is not None and outcome is not None and outcome.attainment is not None:
            out.append((float(load), outcome.attainment, outcome.passed, lv.label))
    return sorted(out)


def boundary_of(levels: ServeLevels, tier: str) -> float | None:
    found = [b for b in (levels.search.tiers if levels.search else []) if b.tier == tier]
    return found[0].boundary if found else None


def _load_label(levels: ServeLevels) -> str:
    axis = levels.search.axis if levels.search else levels.load
    return {"sessions": "lanes", "rate": "rate (req/s)"}.get(axis, axis)


def _attainment_axes(ax: Any, levels: ServeLevels) -> None:
    """SLO attainment (sessions or requests meeting each tier) against the load; filled markers
    passed the tier, hollow ones failed; dashed lines at each tier's boundary."""
    for i, tier in enumerate(levels.tiers):
        color = f"C{i}"
        pts = attainment_points(levels, tier)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, label=tier)
        for x, y, passed, _ in pts:
            ax.plot([x], [y], "o", color=color, fillstyle="full" if passed else "none")
        if (b := boundary_of(levels, tier)) is not None:
            ax.axvline(b, color=color, linestyle="--", alpha=0.6, label=f"{tier} boundary {b:g}")
    ax.set_title("SLO attainment (filled: tier met)")
    ax.set_xlabel(_load_label(levels))
    ax.set_ylabel("fraction meeting the tier")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def serve_curves(directory: Path) -> list[dict[str, Any]]:
    """The same curves as `plot_serve`, as data for the HTML report (`plugin.CurvesRuns`):
    TTFT and TPOT p50/p90 (ms) and goodput against each level's achieved request throughput,
    the knee marked; none when the directory has no levels file or no level completed."""
    from metrale.benchmarks.serve.params import LEVELS_FILE, ServeLevels
    from metrale.fmt import number_text

    path = directory / LEVELS_FILE
    if not path.exists() and not path.is_symlink():
        return []
    try:  # read bounded, a regular file only: the run directory may come from anyone
        levels = ServeLevels.model_validate_json(read_data_file(path, "serve levels file"))
    except (UsageError, ValueError) as exc:
        logger.warning("%s: unreadable, no curves: %s", path, exc)
        return []
    points = sorted(
        (lv for lv in levels.levels if lv.metrics.get("request_throughput")),
        key=lambda lv: float(lv.metrics["request_throughput"] or 0.0),
    )
    knee = next((lv for lv in points if lv.index == levels.knee), None)
    mark = float(knee.metrics["request_throughput"] or 0.0) if knee is not None else None

    def series(key: str, name: str, unit: str, dashed: bool = False) -> dict[str, Any]:
        pts = []
        for lv in points:
            y = lv.metrics.get(key)
            if y is None:
                continue
            x = float(lv.metrics["request_throughput"] or 0.0)
            tip = f"{lv.label}\n{name} {number_text(y)} {unit}\n{number_text(x)} req/s"
            pts.append([x, float(y), tip])
        return {"name": name, "dashed": dashed, "points": pts}

    x_label = "achieved throughput (req/s)"
    tiers = [
        {"title": f"SLO attainment, tier {tier} ({text})", "x_label": _load_label(levels),
         "mark": boundary_of(levels, tier),
         "series": [{"name": "attainment", "dashed": False, "points": [
             [x, y, f"{label}\n{'met' if ok else 'missed'} {tier}\nattainment {number_text(y)}"]
             for x, y, ok, label in attainment_points(levels, tier)]}]}
        for tier, text in levels.tiers.items()
    ]  # fmt: skip
    return [
        *tiers,
        {"title": "TTFT (ms)", "x_label": x_label, "mark": mark,
         "series": [series("ttft_ms_p50", "p50", "ms"), series("ttft_ms_p90", "p90", "ms", True)]},
        {"title": "TPOT (ms)", "x_label": x_label, "mark": mark,
         "series": [series("tpot_ms_p50", "p50", "ms"), series("tpot_ms_p90", "p90", "ms", True)]},
        {"title": "goodput (req/s)", "x_label": x_label, "mark": mark,
         "series": [series("goodput", "goodput", "req/s")]},
    ]  # fmt: skip
