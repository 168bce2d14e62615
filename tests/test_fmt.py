"""metrale.fmt: the one way a number is written for a person."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrale.fmt import (
    clock_text,
    duration_text,
    duration_unit,
    in_unit,
    number_text,
    sig,
    spread_column,
    spread_unit,
)
from metrale.stats import Spread


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0, "0"),
        (123.456, "123"),
        (100.0, "100"),
        (99.99, "100"),
        (9.996, "10"),
        (12.345, "12.3"),
        (6.3, "6.3"),
        (1.5, "1.5"),
        (0.001, "0.001"),
        (0.00091, "0.00091"),
        (0.0000038, "0.0000038"),
        (0.000012345, "0.0000123"),
        (1234.5, "1230"),
        (-0.5, "-0.5"),
        (-150.0, "-150"),
        (1024, "1024"),
        (None, "-"),
        (math.nan, "-"),
    ],
)
def test_sig_is_three_significant_figures_as_plain_decimals(x: float, text: str) -> None:
    assert sig(x) == text


@given(st.floats(min_value=1e-9, max_value=1e9))
def test_sig_is_within_half_a_unit_of_the_third_figure(x: float) -> None:
    text = sig(x)
    assert "e" not in text
    assert abs(float(text) - x) <= 0.005 * x * (1 + 1e-9)


@pytest.mark.parametrize(
    ("values", "unit"),
    [([2.9e-6], "µs"), ([0.0009, 0.002], "ms"), ([0.5, 1.0], "s"), ([], "µs"), ([None], "µs")],
)
def test_a_column_unit_is_chosen_by_its_largest_value(values: list[float], unit: str) -> None:
    assert duration_unit(values) == unit


def test_a_column_of_spreads_shares_one_unit() -> None:
    fast = Spread(n=3, p10=0.0004, p50=0.0005, p90=0.0006)
    slow = Spread(n=3, p10=0.02, p50=0.025, p90=0.03)
    unit, texts = spread_column([fast, slow, Spread(n=0)])
    assert unit == "ms"
    assert texts == ["0.5 (0.4–0.6)", "25 (20–30)", "-"]
    assert in_unit(None, "ms") == "-"


def test_a_long_tail_moves_the_column_up_a_unit() -> None:
    """A pooled run's first rollouts wait for their sandbox: p50 899 µs, p90 290 ms reads
    `0.899 (0.44–290)` ms, not `899 (440–290000)` µs."""
    pooled = Spread(n=9, p10=0.00044, p50=0.000899, p90=0.29)
    assert spread_unit([pooled]) == "ms"
    assert spread_column([pooled]) == ("ms", ["0.899 (0.44–290)"])
    assert pooled.cell() == "0.899 (0.44–290)"
    # a tail that reads 9,990 stays; 10,000 moves; two steps when it must; never past s
    assert spread_unit([Spread(n=3, p10=1e-6, p50=2e-6, p90=0.00999)]) == "µs"
    assert spread_unit([Spread(n=3, p10=1e-6, p50=2e-6, p90=0.01)]) == "ms"
    assert spread_unit([Spread(n=3, p10=1e-6, p50=2e-6, p90=30.0)]) == "s"
    assert spread_unit([Spread(n=3, p10=0.5, p50=2.0, p90=50000.0)]) == "s"
    assert spread_unit([Spread(n=0)]) == "µs"


@pytest.mark.parametrize(
    ("x", "text"),
    [(5.32e-6, "5.32 µs"), (0.373, "373 ms"), (1.5, "1.5 s"), (0.0, "0 s"), (None, "-")],
)
def test_a_lone_duration_carries_its_unit(x: float | None, text: str) -> None:
    assert duration_text(x) == text


def test_signed_texts() -> None:
    assert duration_text(0.002, signed=True) == "+2 ms"
    assert duration_text(-0.002, signed=True) == "-2 ms"
    assert number_text(0.25, signed=True) == "+0.25"
    assert number_text(None, signed=True) == "-"


@pytest.mark.parametrize(
    ("s", "text"), [(0, "0:00"), (59.6, "1:00"), (125, "2:05"), (3725, "1:02:05"), (None, "-:--")]
)
def test_clock(s: float | None, text: str) -> None:
    assert clock_text(s) == text


def test_every_table_writes_numbers_as_fmt_does() -> None:
    """One formatter: serve's level table, the generic table renderer, a verdict line and the
    agentic and terminal_bench summaries write a value as `metrale.fmt` does (0.000015, not
    1.5e-05; 0.123, not 0.12)."""
    from metrale.benchmarks.agentic_webserver.benchmark import AgenticWebserverBenchmark
    from metrale.benchmarks.serve.params import LevelSummary
    from metrale.benchmarks.serve.table import levels_table
    from metrale.benchmarks.terminal_bench.benchmark import TerminalBenchBenchmark
    from metrale.plugin import RunSummary, check_bounds
    from metrale.table import render

    tiny, odd = 1.5e-05, 0.1234
    level = LevelSummary(
        index=0,
        label="c=1",
        metrics={"request_throughput": tiny, "goodput": odd, "ttft_ms_p50": tiny},
    )
    [row] = levels_table([level], None, [50.0, 90.0]).rows
    assert row[1] == "0.000015" and row[4] == "0.000015" and "0.123" in row
    assert render(["x"], [[tiny]]).splitlines()[-1] == "0.000015"
    assert check_bounds({"m": tiny}, {"m_max": 1}).lines() == ["PASS m = 0.000015 (must be <= 1)"]
    summary = RunSummary(records=3, e2e_s=0.0123, reward_mean=odd, metrics={"s_per_turn": odd})
    agentic_bench = object.__new__(AgenticWebserverBenchmark)
    agentic = AgenticWebserverBenchmark.summary_text(agentic_bench, summary)
    assert "s/turn 0.123" in agentic and "e2e 12.3 ms" in agentic
    terminal = object.__new__(TerminalBenchBenchmark)
    terminal.runs, terminal.entries, terminal.tally = [], [], None  # no task read: no image
    text = TerminalBenchBenchmark.summary_text(terminal, summary)
    assert "reward 0.123" in text and "e2e 12.3 ms" in text
