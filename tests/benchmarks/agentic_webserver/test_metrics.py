"""Run-level metrics and the verdict from iteration rows, without running anything."""

from __future__ import annotations

from typing import Any

from metrale.benchmarks.agentic_webserver.benchmark import iteration_metrics, verdict
from metrale.benchmarks.agentic_webserver.directions import CHECKS


def row(index: int, ok: bool, turns: int, agent_wall: float, steps: int = 6) -> dict[str, Any]:
    names = list(CHECKS)
    return {
        "index": index, "webserver_ok": ok, "steps": steps,
        "directions": {n: i < steps for i, n in enumerate(names)},
        "wall_s": agent_wall + 1, "agent_wall_s": agent_wall, "turns": turns,
        "tool_calls": turns, "completion_tokens": 10 * turns, "hit_turn_cap": False,
        "truncated_turns": 0, "unparsed_call_turns": 0,
        "failed": not (ok and steps == 6), "note": "" if ok and steps == 6 else "missed: x",
    }  # fmt: skip


def test_sums_rates_and_tallies() -> None:
    m = iteration_metrics([row(0, True, 4, 8.0), row(1, False, 6, 12.0, steps=2)])
    assert m["iterations"] == 2 and m["webserver_ok"] == 1 and m["followed_directions"] == 1
    assert m["sum_turns"] == 10 and m["s_per_turn"] == 2.0 and m["decode_tps"] == 5.0
    assert m["steps_tests_passed"] == 2 and m["steps_curl_proved"] == 1
    assert m["max_iter_turns"] == 6 and m["sum_wall_s"] == 22.0


def test_no_turn_means_no_s_per_turn_not_zero() -> None:
    m = iteration_metrics([row(0, False, 0, 0.0, steps=0)])
    assert m["s_per_turn"] is None and m["decode_tps"] is None and m["sum_turns"] == 0


def test_verdict_names_each_failure() -> None:
    rows = [row(0, True, 4, 8.0), row(1, False, 6, 12.0, steps=2)]
    m = iteration_metrics(rows)
    v = verdict(rows, m, {"wall_budget_s": 10.0, "s_per_turn_budget": 1.0})
    assert v.passed is False
    assert [c.metric for c in v.checks if not c.passed] == [
        "failed_iterations", "sum_wall_s", "s_per_turn",
    ]  # fmt: skip
    assert "run 1: missed: x" in v.checks[0].reason
    ok = verdict(rows[:1], iteration_metrics(rows[:1]), {"wall_budget_s": None})
    assert ok.passed is True and len(ok.checks) == 1
    none = verdict([], {"s_per_turn": None, "sum_wall_s": 0}, {"s_per_turn_budget": 1.0})
    assert none.checks[1].passed is False and none.checks[1].reason.startswith("absent")


def test_no_iterations_is_an_error_not_a_pass() -> None:
    from metrale.benchmarks.agentic_webserver import AgenticWebserverBenchmark
    from metrale.plugin import Status

    bench = AgenticWebserverBenchmark()
    bench.configure({})
    result = bench._snapshot(Status.COMPLETED, final=True)
    assert result.status is Status.FAILED and result.error == "No iterations ran"
    assert "max_iter_turns" not in result.metrics
