"""The numbers of session load: latency by turn and by context length, and per session.

Every value here is a declared metric's statistic over the sample `session_samples` gives, so
`report`, `compare`, `plot` and the HTML page read them like any other (`declared.py`):

- **by turn index** (`ttft_ms_p50_turn2_4`, ...): TTFT, TPOT and ITL (ms, as in `metrics`) of
  the measured successful requests whose turn (1 = a session's first chat call) falls in the
  bucket 1, 2–4, 5–8, 9–16, 17+;
- **by context length** (`ttft_ms_p50_ctx_4k_16k`, ...): the same by the request's prompt tokens
  (server usage; requests without usage are in no bucket): < 1k, 1k–4k, 4k–16k, 16k–64k, ≥ 64k
  (k = 1024);
- **per session**, over the measured sessions (a session is the requests of one session id):
  **wall** = last turn's end − the session's start (its first turn's intended time minus that
  turn's tool time); **model** = Σ E2E of its turns (send to end of stream); **tool** = Σ tool
  time; **waiting** = wall − model − tool (the client's scheduling and a failed turn's time to
  failure); `session_goodput` = the fraction of sessions whose every turn succeeded and met the
  per-request SLOs (`metrics.meets_slos`);

- **live sessions** (`--session-source live`, `live.py`), over the measured sessions' rollouts:
  `session_reward_mean` = mean of the task's reward over the sessions that have one (the
  benchmark's own scoring, after an agent that ran under this load); `session_error_rate` =
  sessions whose rollout ended in an error (typed as rollouts record them) / sessions. A level
  whose sessions ran more than one task (a dataset) also gets the reward per task as a log
  line (`live_by_task`): task names are data, not declared metrics.

The cached prompt tokens the server reports, the ideal hit rate of the prompts sent and their
ratio are serve's prefix-cache metrics (`metrics.prefix_rates`), fed by session turns too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from metrale.benchmarks.serve.metrics import RequestRecord, itl_samples, meets_slos, tpot
from metrale.plugin import Metric
from metrale.plugin.metrics import Stat, compute
from metrale.stats import percentile

#: (name, lowest turn) of each turn bucket, in order; a bucket ends where the next begins.
TURN_BUCKETS = (("turn1", 1), ("turn2_4", 2), ("turn5_8", 5), ("turn9_16", 9), ("turn17p", 17))
#: (name, fewest prompt tokens) of each context-length bucket.
CTX_BUCKETS = (
    ("ctx_lt1k", 0), ("ctx_1k_4k", 1024), ("ctx_4k_16k", 4096), ("ctx_16k_64k", 16384),
    ("ctx_ge64k", 65536),
)  # fmt: skip
_QS: tuple[Stat, ...] = ("p50", "p90")
_SERIES: dict[str, Callable[[RequestRecord], list[float]]] = {
    "ttft": lambda r: [r.ttft_s * 1000] if r.ttft_s is not None else [],
    "tpot": lambda r: [x * 1000] if (x := tpot(r)) is not None else [],
    "itl": lambda r: [x * 1000 for x in itl_samples(r)],
}


def bucket(value: int | None, buckets: Sequence[tuple[str, int]]) -> str | None:
    """The name of the last bucket whose lower bound `value` reaches; None for None."""
    if value is None:
        return None
    name = None
    for label, low in buckets:
        if value >= low:
            name = label
    return name


def _bucket_metrics() -> list[Metric]:
    out = []
    for group, what in ((TURN_BUCKETS, "turn index"), (CTX_BUCKETS, "prompt tokens")):
        for label, _ in group:
            for series in _SERIES:
                for q in _QS:
                    out.append(Metric(
                        f"{series}_ms_{q}_{label}", "ms", "lower", stat=q,
                        doc=f"{q} {series.upper()} of the requests whose {what} is in {label}",
                    ))  # fmt: skip
    return out


SESSION_METRICS: tuple[Metric, ...] = (
    *_bucket_metrics(),
    Metric("session_goodput", "fraction", "higher", stat="mean",
           doc="measured sessions whose every turn succeeded and met the SLOs / sessions"),
    Metric("session_wall_s_p50", "s", "lower", stat="p50",
           doc="p50 of session wall time: last end - start"),
    Metric("session_model_s_mean", "s", "lower", stat="mean",
           doc="mean of a session's model time: sum of its turns' E2E"),
    Metric("session_tool_s_mean", "s", None, stat="mean",
           doc="mean of a session's tool time: sum of the tool time before its turns"),
    Metric("session_wait_s_mean", "s", "lower", stat="mean",
           doc="mean of a session's waiting: wall - model - tool"),
    Metric("turns_per_session_mean", "turns", None, stat="mean",
           doc="mean requests per measured session"),
)  # fmt: skip


#: Numbers of the live source's sessions (`live.py`), from each measured session's rollout.
LIVE_METRICS: tuple[Metric, ...] = (
    Metric("session_reward_mean", "reward", "higher", stat="mean",
           doc="live sessions: mean over measured sessions with a reward of the task's reward "
           "(the benchmark's scoring of what the agent did under this load)"),
    Metric("session_error_rate", "fraction", "lower", stat="mean",
           doc="live sessions: measured sessions whose rollout ended in an error / sessions"),
)  # fmt: skip


#: A measured live session's outcome: (reward, ended in an error, its task or None).
Outcome = tuple[float | None, bool, str | None]


def live_samples(outcomes: Sequence[Outcome]) -> dict[str, list[Any]]:
    """`LIVE_METRICS`' samples from the measured live sessions' outcomes."""
    return {
        "session_reward_mean": [o[0] for o in outcomes if o[0] is not None],
        "session_error_rate": [1.0 if o[1] else 0.0 for o in outcomes],
    }


def summarize_live(outcomes: Sequence[Outcome]) -> dict[str, float | None]:
    samples = live_samples(outcomes)
    return {m.name: compute(m.stat, samples[m.name]) for m in LIVE_METRICS}


def live_by_task(outcomes: Sequence[Outcome]) -> str | None:
    """The reward per task of a level whose sessions ran more than one task (a dataset), by
    task name (the order sessions end in varies): `fix-git reward 1 over 2 sessions (0
    errors), ...`; None for one task (the level's `session_reward_mean` is its)."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o[2] or "?", []).append(o)
    if len(groups) < 2:
        return None
    parts = []
    for task, rows in sorted(groups.items()):
        rewards = [o[0] for o in rows if o[0] is not None]
        mean = "-" if not rewards else f"{sum(rewards) / len(rewards):.3g}"
        errors = sum(1 for o in rows if o[1])
        parts.append(f"{task} reward {mean} over {len(rows)} sessions ({errors} errors)")
    return "live sessions by task: " + ", ".join(parts)


def _by_session(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.session is not None and r.phase == "measure":
            groups.setdefault(r.session, []).append(r)
    return groups


def session_times(turns: Sequence[RequestRecord]) -> tuple[float, float, float, float]:
    """(wall, model, tool, waiting) of one session's records, in seconds."""
    first = min(turns, key=lambda r: r.intended_s)
    start = first.intended_s - (first.tool_s or 0.0)
    end = max((r.end_s if r.end_s is not None else r.intended_s) for r in turns)
    model = sum(r.e2e_s or 0.0 for r in turns)
    tool = sum(r.tool_s or 0.0 for r in turns)
    wall = end - start
    return wall, model, tool, max(wall - model - tool, 0.0)


def session_samples(
    records: Sequence[RequestRecord], slos: Mapping[str, float]
) -> dict[str, list[Any]]:
    """The sample of each `SESSION_METRICS` entry over one level's records."""
    out: dict[str, list[Any]] = {m.name: [] for m in SESSION_METRICS}
    ok = [r for r in records if r.phase == "measure" and r.ok and r.session is not None]
    for r in ok:
        for label in (bucket(r.turn, TURN_BUCKETS), bucket(r.prompt_tokens, CTX_BUCKETS)):
            if label is None:
                continue
            for series, values in _SERIES.items():
                got = values(r)
                for q in _QS:
                    out[f"{series}_ms_{q}_{label}"].extend(got)
    for turns in _by_session(records).values():
        wall, model, tool, wait = session_times(turns)
        out["session_goodput"].append(float(all(meets_slos(r, slos) for r in turns)))
        out["session_wall_s_p50"].append(wall)
        out["session_model_s_mean"].append(model)
        out["session_tool_s_mean"].append(tool)
        out["session_wait_s_mean"].append(wait)
        out["turns_per_session_mean"].append(float(len(turns)))
    return out


def by_turn(records: Sequence[RequestRecord]) -> dict[str, dict[str, float | None]]:
    """Per exact turn index (`levels.json`'s `by_turn`): measured requests, and TTFT, TPOT and
    ITL p50 and p90 (ms) over the successful ones; the declared buckets above group these."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.phase == "measure" and r.turn is not None:
            turns.setdefault(r.turn, []).append(r)
    out: dict[str, dict[str, float | None]] = {}
    for turn in sorted(turns):
        group = turns[turn]
        row: dict[str, float | None] = {"requests": float(len(group))}
        for series, values in _SERIES.items():
            sample = [x for r in group if r.ok for x in values(r)]
            for q in _QS:
                row[f"{series}_ms_{q}"] = percentile(sample, float(q[1:]))
        out[str(turn)] = row
    return out


def summarize_sessions(
    records: Sequence[RequestRecord], slos: Mapping[str, float]
) -> dict[str, float | int | None]:
    """Each session metric's value: its statistic over `session_samples`, plus `sessions`."""
    samples = session_samples(records, slos)
    values: dict[str, float | int | None] = {
        m.name: compute(m.stat, samples[m.name]) for m in SESSION_METRICS
    }
    values["sessions"] = len(_by_session(records))
    return values
