"""agentic_webserver's declared metrics, its per-rollout note and its verdict rules.

Every number is computed from the rollout records (`RolloutRecord.metrics` as the rollout
filled it: webserver_ok, directions, agent_wall_s, tool_calls, ...), once, by the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metrale.benchmarks.agentic_webserver.directions import CHECKS
from metrale.plugin import Check, Metric, Verdict
from metrale.rollout import RolloutRecord, bound_check


def _flag(key: str) -> Any:
    return lambda r: 1.0 if r.metrics.get(key) else 0.0


def _num(key: str) -> Any:
    return lambda r: float(r.metrics.get(key) or 0)


def _direction(name: str) -> Any:
    return lambda r: 1.0 if (r.metrics.get("directions") or {}).get(name) else 0.0


def _followed(r: RolloutRecord) -> float:
    directions = r.metrics.get("directions") or {}
    return 1.0 if directions and all(directions.get(c) for c in CHECKS) else 0.0


def _failed(r: RolloutRecord) -> float:
    return 0.0 if r.error is None and r.reward == 1.0 else 1.0


def _agent_wall(r: RolloutRecord) -> float | None:
    return r.metrics.get("agent_wall_s")


METRICS: tuple[Metric, ...] = (
    Metric("webserver_ok", "rollouts", "higher", stat="sum", value=_flag("webserver_ok"),
           doc="rollouts whose server, built and run by the scorer, answered GET /ping"),
    Metric("followed_directions", "rollouts", "higher", stat="sum", value=_followed,
           doc="rollouts that passed all six directions checks"),
    Metric("failed_iterations", "rollouts", "lower", stat="sum", value=_failed,
           doc="rollouts with reward 0 or an error"),
    Metric("turns", "turns", None, stat="mean", value=lambda r: r.turns, column=True,
           doc="mean over rollouts of chat calls answered in the agent loop"),
    Metric("tool_calls", "calls", None, stat="mean", value=_num("tool_calls"),
           doc="mean over rollouts of commands run (tool calls and fenced blocks)"),
    Metric("s_per_turn", "s", "lower", stat="ratio", value=_agent_wall,
           per=lambda r: r.turns if r.turns else None, column=True,
           doc="sum of agent wall / sum of turns (agent wall: loop start to loop end, "
           "commands included; absent when no turn was taken)"),
    Metric("decode_tps", "tok/s", "higher", stat="ratio",
           value=lambda r: r.tokens.completion if r.tokens.completion is not None else None,
           per=lambda r: v if (v := _agent_wall(r)) else None,
           doc="sum of completion tokens / sum of agent wall: tokens the agent loop received "
           "per second of its wall time, commands included"),
    Metric("sum_wall_s", "s", "lower", stat="sum", value=lambda r: r.total_s,
           doc="sum over rollouts of total (setup start to scoring end)"),
    Metric("sum_agent_wall_s", "s", None, stat="sum", value=_agent_wall,
           doc="sum over rollouts of agent wall"),
    Metric("sum_turns", "turns", None, stat="sum", value=lambda r: r.turns,
           doc="sum over rollouts of turns"),
    Metric("sum_tool_calls", "calls", None, stat="sum", value=_num("tool_calls"),
           doc="sum over rollouts of tool calls"),
    Metric("sum_completion_tokens", "tokens", None, stat="sum",
           value=lambda r: r.tokens.completion, doc="sum over rollouts of completion tokens"),
    Metric("max_iter_turns", "turns", None, stat="max", value=lambda r: r.turns,
           doc="the most turns one rollout took"),
    Metric("sum_hit_turn_cap", "rollouts", "lower", stat="sum", value=_flag("hit_turn_cap"),
           doc="rollouts ended by the turn cap"),
    Metric("sum_truncated_turns", "turns", "lower", stat="sum", value=_num("truncated_turns"),
           doc="turns cut by max_tokens (finish_reason length)"),
    Metric("sum_unparsed_call_turns", "turns", "lower", stat="sum",
           value=_num("unparsed_call_turns"),
           doc="turns whose tool call could not be parsed"),
    *(Metric(f"steps_{name}", "rollouts", "higher", stat="sum", value=_direction(name),
             doc=f"rollouts that passed the {name} directions check") for name in CHECKS),
)  # fmt: skip


def rollout_note(record: RolloutRecord, max_turns: int) -> str:
    """What went wrong in one rollout, in a few words (empty when nothing did)."""
    m = record.metrics
    notes: list[str] = []
    if record.error is not None:
        notes.append(f"{record.error.stage} error: {record.error.type}: {record.error.message}")
    if m.get("score_note"):
        notes.append(m["score_note"])
    if m.get("hit_turn_cap"):
        notes.append(f"hit the turn cap ({max_turns})")
    if m.get("agent_error"):
        notes.append(f"agent stopped: {m['agent_error']}")
    if m.get("timed_out_commands"):
        notes.append(f"{m['timed_out_commands']} command(s) timed out")
    if m.get("unparsed_call_turns"):
        notes.append(f"{m['unparsed_call_turns']} unparsed call turn(s)")
    if m.get("truncated_turns"):
        notes.append(f"{m['truncated_turns']} truncated turn(s)")
    directions = m.get("directions") or dict.fromkeys(CHECKS, False)
    missed = [name for name, passed in directions.items() if not passed]
    if missed:
        notes.append("missed: " + ", ".join(missed))
    return "; ".join(notes)


def verdict(
    records: list[RolloutRecord], metrics: Mapping[str, Any], values: Mapping[str, Any]
) -> Verdict:
    """Fails on any failed rollout (naming each), on `sum_wall_s > wall_budget_s`, and on
    `s_per_turn > s_per_turn_budget` (an absent s_per_turn does not meet a budget)."""
    failed = [r for r in sorted(records, key=lambda r: r.index) if _failed(r)]
    checks = [
        Check(
            metric="failed_iterations",
            op="<=",
            limit=0,
            value=len(failed),
            passed=not failed,
            reason="; ".join(f"run {r.index}: {r.metrics.get('note') or 'failed'}" for r in failed),
        )
    ]
    if values.get("wall_budget_s") is not None:
        checks.append(bound_check("sum_wall_s", metrics.get("sum_wall_s"), values["wall_budget_s"]))
    if values.get("s_per_turn_budget") is not None:
        check = bound_check("s_per_turn", metrics.get("s_per_turn"), values["s_per_turn_budget"])
        if check.value is None:
            check.reason = "absent: no turn taken"
        checks.append(check)
    return Verdict(checks=checks)
