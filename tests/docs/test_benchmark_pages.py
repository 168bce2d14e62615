"""Each registered benchmark has its page under docs/benchmarks/, and the page names every
parameter and every metric the benchmark declares, so a declaration added without its
documentation fails here (the formula of a metric lives in its `doc`, the page says it too)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metrale.plugin import discover
from metrale.rollout import RolloutBenchmark

PAGES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
#: the page that documents the metrics every rollout benchmark reports
STANDARD = PAGES / "gsm8k.md"


def documented(name: str, text: str) -> bool:
    """`name` in backticks, or a family written `prefix_<what>` with the rest in backticks
    (`steps_<direction>` and `tests_passed` document `steps_tests_passed`)."""
    if f"`{name}`" in text:
        return True
    for prefix in re.findall(r"`([a-z0-9_]+_)<[a-z_]+>`", text):
        if name.startswith(prefix) and f"`{name[len(prefix) :]}`" in text:
            return True
    return False


@pytest.mark.parametrize("benchmark_id", sorted(discover()))
def test_the_page_names_every_parameter_and_metric(benchmark_id: str) -> None:
    page = PAGES / f"{benchmark_id}.md"
    assert page.is_file(), f"no docs/benchmarks/{benchmark_id}.md"
    bench = discover()[benchmark_id]()
    bench.configure({})
    text = page.read_text(encoding="utf-8")
    if isinstance(bench, RolloutBenchmark):
        text += STANDARD.read_text(encoding="utf-8")
    missing = [p.name for p in bench.parameters() if not documented(p.name, text)]
    missing += [m.name for m in bench.metrics() if not documented(m.name, text)]
    assert not missing, f"docs/benchmarks/{benchmark_id}.md does not name: {', '.join(missing)}"


def test_a_family_of_metrics_is_documented_by_its_pattern_and_members() -> None:
    text = "`steps_<direction>` ... `tests_passed`"
    assert documented("steps_tests_passed", text)
    assert not documented("steps_curl_proved", text)
    assert not documented("accuracy", "accuracy without backticks")
