"""Run-level metrics and the verdict from rollout records, without running anything.

The numbers are the declared metrics (`agentic_webserver.metrics.METRICS`) computed by the
driver's summary from records as the rollouts write them; the expectations are literal.
"""

from __future__ import annotations

from metrale.benchmarks.agentic_webserver import AgenticWebserverBenchmark
from metrale.benchmarks.agentic_webserver.directions import CHECKS
from metrale.benchmarks.agentic_webserver.metrics import rollout_note, verdict
from metrale.rollout import ErrorInfo, RolloutRecord, Tokens, summarize_records


def record(index: int, ok: bool, turns: int, agent_wall: float, steps: int = 6) -> RolloutRecord:
    names = list(CHECKS)
    directions = {n: i < steps for i, n in enumerate(names)}
    r = RolloutRecord(
        id=f"r-{index}", benchmark="agentic_webserver", index=index, started_at=0.0,
        total_s=agent_wall + 1, turns=turns, tokens=Tokens(completion=10 * turns),
        reward=1.0 if ok and steps == 6 else 0.0,
        metrics={"webserver_ok": ok, "directions": directions, "agent_wall_s": agent_wall,
                 "tool_calls": turns, "hit_turn_cap": False, "truncated_turns": 0,
                 "unparsed_call_turns": 0},
    )  # fmt: skip
    r.metrics["note"] = rollout_note(r, 30)
    return r


def metrics_of(records: list[RolloutRecord]) -> dict:  # type: ignore[type-arg]
    bench = AgenticWebserverBenchmark()
    bench.configure({})
    return summarize_records(records, bench.metrics()).metrics


def test_sums_rates_and_tallies() -> None:
    m = metrics_of([record(0, True, 4, 8.0), record(1, False, 6, 12.0, steps=2)])
    assert m["webserver_ok"] == 1 and m["followed_directions"] == 1
    assert m["failed_iterations"] == 1 and m["reward_mean"] == 0.5
    assert m["sum_turns"] == 10 and m["s_per_turn"] == 2.0 and m["decode_tps"] == 5.0
    assert m["steps_tests_passed"] == 2 and m["steps_curl_proved"] == 1
    assert m["max_iter_turns"] == 6 and m["sum_wall_s"] == 22.0 and m["turns"] == 5.0


def test_no_turn_means_no_s_per_turn_not_zero() -> None:
    m = metrics_of([record(0, False, 0, 0.0, steps=0)])
    assert m["s_per_turn"] is None and m["decode_tps"] is None and m["sum_turns"] == 0


def test_a_failed_rollout_counts_as_failed_and_its_note_says_why() -> None:
    error = ErrorInfo(type="RuntimeStartError", message="no", stage="setup")
    r = RolloutRecord(id="r-0", benchmark="agentic_webserver", index=0, started_at=0.0, error=error)
    assert metrics_of([r])["failed_iterations"] == 1
    assert rollout_note(r, 30).startswith("setup error: RuntimeStartError: no")


def test_verdict_names_each_failure() -> None:
    records = [record(0, True, 4, 8.0), record(1, False, 6, 12.0, steps=2)]
    m = metrics_of(records)
    v = verdict(records, m, {"wall_budget_s": 10.0, "s_per_turn_budget": 1.0})
    assert v.passed is False
    assert [c.metric for c in v.checks if not c.passed] == [
        "failed_iterations", "sum_wall_s", "s_per_turn",
    ]  # fmt: skip
    assert "run 1: missed: " in v.checks[0].reason
    ok = verdict(records[:1], metrics_of(records[:1]), {"wall_budget_s": None})
    assert ok.passed is True and len(ok.checks) == 1
    none = verdict([], {"s_per_turn": None, "sum_wall_s": 0}, {"s_per_turn_budget": 1.0})
    assert none.checks[1].passed is False and none.checks[1].reason.startswith("absent")


def test_no_rollout_is_an_error_not_a_pass() -> None:
    from metrale.plugin import Status

    bench = AgenticWebserverBenchmark()
    bench.configure({})
    result = bench.final()
    assert result.status is Status.FAILED and result.error == "no rollout ran"


def test_iterations_is_an_alias_of_rollouts() -> None:
    import pytest

    from metrale.errors import UsageError

    bench = AgenticWebserverBenchmark()
    assert bench.configure({"iterations": "3"})["rollouts"] == 3
    assert bench.configure({"rollouts": 2})["iterations"] == 2
    with pytest.raises(UsageError, match="iterations=3 and rollouts=2 disagree"):
        bench.configure({"iterations": 3, "rollouts": 2})
