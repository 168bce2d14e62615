"""serve's table: one row per load level, latencies in ms, the knee marked."""

from __future__ import annotations

from metrale.benchmarks.serve.metrics import q_text
from metrale.benchmarks.serve.params import LevelSummary
from metrale.fmt import in_unit, number_text
from metrale.plugin import Table
from metrale.stats import percentile


def ms_text(values: list[float], q: float) -> str:
    """The q-th percentile of `values` (seconds) in ms, written as `metrale.fmt` writes it."""
    return in_unit(percentile(values, q), "ms")


def levels_table(
    levels: list[LevelSummary], knee_index: int | None, qs: list[float], mark: str = "knee"
) -> Table:
    """One row per level; the level at `knee_index` marked `*knee` (or `*capacity`: the first
    SLO tier's boundary of a search)."""
    lo = "p" + q_text(50 if 50 in qs else qs[0])
    hi = "p" + q_text(90 if 90 in qs else qs[-1])
    cols = [
        "level", "req/s", "out tok/s", "peak tok/s", f"TTFT {lo}", f"TTFT {hi}",
        f"TPOT {lo}", f"TPOT {hi}", f"ITL {lo}", f"E2E {lo}", "goodput", "err", "lag p99",
        "client lag p99",
    ]  # fmt: skip
    rows = []
    for lv in levels:
        m = lv.metrics
        name = lv.label + (f" *{mark}" if knee_index is not None and lv.index == knee_index else "")

        def ms(key: str, m: dict[str, float | int | None] = m) -> str:
            return number_text(m.get(key))

        rows.append([
            name, number_text(m.get("request_throughput")), number_text(m.get("output_throughput")),
            m.get("peak_output_tps"), ms(f"ttft_ms_{lo}"), ms(f"ttft_ms_{hi}"),
            ms(f"tpot_ms_{lo}"), ms(f"tpot_ms_{hi}"), ms(f"itl_ms_{lo}"), ms(f"e2e_ms_{lo}"),
            number_text(m.get("goodput")), m.get("errors"), ms("sched_lag_ms_p99"),
            ms("client_lag_ms_p99"),
        ])  # fmt: skip
    return Table(columns=[*cols[:4], *(c + " ms" if " p" in c else c for c in cols[4:])], rows=rows)
