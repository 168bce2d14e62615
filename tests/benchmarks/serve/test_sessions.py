"""Sessions as load: the three sources' one shape, the lanes, and the session metrics."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from metrale.agent import Agent, AgentConfig
from metrale.benchmarks.serve.lanes import run_lanes
from metrale.benchmarks.serve.load import Bound, LevelSpec, LevelState
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.benchmarks.serve.prompts import load_jsonl
from metrale.benchmarks.serve.session_metrics import (
    CTX_BUCKETS,
    TURN_BUCKETS,
    bucket,
    by_turn,
    summarize_sessions,
)
from metrale.benchmarks.serve.sessions import (
    RecordedSessions,
    Session,
    SyntheticSessions,
    ToolTime,
    Turn,
    load_sessions,
)
from metrale.errors import UsageError
from tests.test_agent import Script, bash, reply


def synthetic(**kw: Any) -> SyntheticSessions:
    args: dict[str, Any] = dict(turns=6, turn_tokens=20, system_tokens=50,
                                tool_time=ToolTime.parse("exp:0.5"), seed=3)  # fmt: skip
    return SyntheticSessions(**{**args, **kw})


def words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def test_synthetic_sessions_are_a_function_of_seed_and_number() -> None:
    a, b = synthetic(), synthetic()
    assert a.session(5) == b.session(5)
    assert a.session(5) != a.session(6)
    assert synthetic(seed=4).session(5) != a.session(5)
    s = a.session(2)
    assert len(s.turns) == 6 and s.turns[0] == Turn(upto=2)
    # Each turn sends more than the one before: its prefix plus a tool call and its result.
    sizes = [words(s.messages[: t.upto]) for t in s.turns]
    assert all(later - earlier >= 20 for earlier, later in itertools.pairwise(sizes))
    # Shared system prompt, then the session's own marker.
    assert s.messages[0] == a.session(9).messages[0] and words(s.messages[:1]) == 50
    assert s.messages[1]["content"].startswith("[session s2] ")
    assert all(t.tool_s > 0 for t in s.turns[1:])
    calls = [m for m in s.messages if m["role"] == "assistant"]
    assert all(m["content"] is None and m["tool_calls"][0]["function"]["name"] == "bash"
               for m in calls)  # fmt: skip


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of `obj` and everything it reaches (each object once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple):
        size += sum(deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, n), seen) for n in obj.__slots__)
    return size


def test_a_session_keeps_its_messages_not_a_copy_per_turn() -> None:
    """Memory per session grows with its messages (turns × tokens), not turns² × tokens."""

    def size(turns: int) -> int:
        s = synthetic(turns=turns, turn_tokens=100).session(0)
        assert len(s.turns) == turns
        return deep_size(s)

    small, big = size(20), size(80)
    assert big < 5.5 * small  # 4x the turns: linear is ~4x, a copy per turn would be ~16x


@pytest.mark.parametrize(
    "text", ["exp", "exp:-1", "uniform:2:1", "gauss:1", "const:x", "exp:nan", "uniform:1"]
)
def test_bad_tool_time_is_one_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="tool_time"):
        ToolTime.parse(text)


def test_tool_time_draws() -> None:
    rng = random.Random(1)
    assert ToolTime.parse("const:0.25").draw(rng) == 0.25
    xs = [ToolTime.parse("uniform:1:2").draw(rng) for _ in range(200)]
    assert min(xs) >= 1 and max(xs) <= 2
    mean = sum(ToolTime.parse("exp:0.5").draw(rng) for _ in range(4000)) / 4000
    assert mean == pytest.approx(0.5, rel=0.1)


def test_session_format_turns_tool_time_and_null_content(tmp_path: Path) -> None:
    line = {
        "id": "a",
        "tools": [{"type": "function", "function": {"name": "ls"}}],
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": None, "max_tokens": 7,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "out", "tool_s": 1.5},
            {"role": "assistant", "content": "done"},
        ],
    }  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (s,) = load_sessions(path)
    assert s.id == "a" and s.tools == line["tools"]
    assert s.turns == [Turn(upto=2, tool_s=0.0, max_tokens=7), Turn(upto=4, tool_s=1.5)]
    assert all("tool_s" not in m and "max_tokens" not in m for m in s.messages)
    assert s.messages[2]["content"] is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("not json\n", "not JSON"),
        ('{"messages": "x"}\n', "'messages'"),
        ('{"messages": [{"role": "user", "content": "q"}]}\n', "no assistant message"),
        ('{"messages": [{"content": "q"}]}\n', "'role'"),
        ("", "empty"),
    ],
)
def test_bad_session_file_is_one_usage_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match=needle):
        load_sessions(path)


def test_prompts_file_accepts_an_assistant_message_with_null_content(tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    assert load_jsonl(path)[0].messages == messages
    path.write_text(json.dumps({"messages": [{"role": "user", "content": None}]}) + "\n")
    with pytest.raises(UsageError, match="null on an assistant"):
        load_jsonl(path)


def test_an_agent_transcript_is_a_recorded_session(tmp_path: Path) -> None:
    """The transcript the agent loop writes (a run directory's transcripts/) replays as a
    session: one turn per reply, the commands' real durations as tool time."""
    from metrale.runtime import configs

    async def go() -> None:
        runtime = configs.create_runtime(configs.runtime_config("subprocess"))
        await runtime.start()
        try:
            model = Script(
                reply("", [bash("sleep 0.3")], tokens=11),
                reply("", [bash("echo hi")], tokens=12),
                reply("done", tokens=3),
            )
            transcript = tmp_path / "run" / "transcripts" / "0.jsonl"
            await Agent(model, runtime, AgentConfig(), transcript=transcript).run("do it")  # type: ignore[arg-type]
        finally:
            await runtime.stop()

    asyncio.run(go())
    (s,) = load_sessions(tmp_path / "run")
    assert [t.upto for t in s.turns] == [2, 4, 6]
    assert [t.max_tokens for t in s.turns] == [11, 12, 3]
    assert s.turns[0].tool_s == 0 and 0.3 <= s.turns[1].tool_s < 5 and s.turns[2].tool_s < 5
    assert all("extra" not in m and m["role"] != "exit" for m in s.messages)
    assert s.messages[2]["content"] is None and s.messages[2]["tool_calls"]
    # Replays of one recording in two lanes differ only by their marker.
    rec = RecordedSessions([s])
    one, two = rec.session(0), rec.session(1)
    assert one.messages[1]["content"] == "[session 0] do it"
    assert two.messages[1]["content"] == "[session 1] do it"
    assert one.messages[2:] == two.messages[2:] and s.messages[1]["content"] == "do it"
    assert RecordedSessions([s], marker=False).session(1).messages == s.messages


# ------------------------------------------------------------------------------ lanes


def level(lanes: int, sessions: int, **kw: Any) -> LevelSpec:
    return LevelSpec(index=0, label="l", lanes=lanes, measure=Bound(count=sessions), **kw)


def test_lanes_run_every_turn_of_every_measured_session_with_tool_time() -> None:
    source = synthetic(turns=4, tool_time=ToolTime.parse("const:0.02"))
    sent: list[tuple[str, int]] = []
    in_flight, peak = 0, 0

    async def send(session: Session, turn: Turn, record: RequestRecord) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        record.send_s = time.perf_counter() - t0
        sent.append((session.id, turn.upto))
        await asyncio.sleep(0.01)
        record.e2e_s, record.ttft_s = 0.01, 0.005
        record.end_s = time.perf_counter() - t0
        in_flight -= 1

    t0 = time.perf_counter()
    spec = level(3, 7, warmup=Bound(count=2))
    state = LevelState(spec)
    records = asyncio.run(run_lanes(spec, source, send, lambda r: None, state, t0))
    assert len(records) == 7 * 4 and peak <= 3
    assert len({r.session for r in records}) == 7
    for sid in {r.session for r in records}:
        turns = sorted((r for r in records if r.session == sid), key=lambda r: r.turn or 0)
        assert [r.turn for r in turns] == [1, 2, 3, 4]
        for a, b in itertools.pairwise(turns):
            assert b.tool_s == 0.02
            assert b.intended_s == pytest.approx((a.end_s or 0) + 0.02)
            assert (b.send_s or 0) >= b.ready_s >= (a.end_s or 0) + 0.02 - 1e-9
    assert sum(1 for s, _ in sent) >= 9 * 4 - 3 * 4  # warm-up sessions ran too


def test_a_ramp_spreads_the_lanes_first_turns() -> None:
    firsts: list[float] = []

    async def send(session: Session, turn: Turn, record: RequestRecord) -> None:
        firsts.append(time.perf_counter() - t0)
        await asyncio.sleep(0.5)  # each lane holds its one session past the ramp
        record.e2e_s, record.end_s = 0.5, time.perf_counter() - t0

    t0 = time.perf_counter()
    spec = level(4, 4, ramp_s=0.4)
    source = synthetic(turns=1, tool_time=ToolTime.parse("const:0"))
    asyncio.run(run_lanes(spec, source, send, lambda r: None, LevelState(spec), t0))
    assert [round(x, 1) for x in sorted(firsts)] == [0.0, 0.1, 0.2, 0.3]


def test_early_stop_ends_a_level_of_lanes() -> None:
    async def send(session: Session, turn: Turn, record: RequestRecord) -> None:
        await asyncio.sleep(0.001)
        record.error = "http_500: no"
        record.end_s = 0.0

    spec = level(2, 1000)
    state = LevelState(spec)
    stop = lambda st: "saturated" if len(st.measured) >= 5 else None  # noqa: E731
    records = asyncio.run(run_lanes(spec, synthetic(tool_time=ToolTime.parse("const:0")), send,
                                    lambda r: None, state, 0.0, early_stop=stop))  # fmt: skip
    assert state.stopped == "saturated" and 5 <= len(records) < 20


# ------------------------------------------------------------------------------ metrics


def rec(
    session: str, turn: int, *, start: float, e2e: float, tool: float, ttft: float,
    prompt: int = 100, cached: int | None = None, error: str | None = None,
) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        level=0, index=0, phase="measure", intended_s=start, ready_s=start, send_s=start,
        end_s=start + e2e, ttft_s=ttft, e2e_s=e2e, output_tokens=1, session=session, turn=turn,
        tool_s=tool, prompt_tokens=prompt, cached_tokens=cached, error=error,
    )  # fmt: skip


def test_session_metrics_split_wall_time_and_count_sessions_meeting_every_turn() -> None:
    a = [rec("a", 1, start=1.0, e2e=0.5, tool=0.0, ttft=0.1, prompt=500, cached=0),
         rec("a", 2, start=2.5, e2e=0.5, tool=0.8, ttft=0.3, prompt=2000, cached=1500)]  # fmt: skip
    b = [rec("b", 1, start=1.0, e2e=0.2, tool=0.0, ttft=0.1),
         rec("b", 2, start=1.3, e2e=0.2, tool=0.1, ttft=0.1, error="timeout: x")]  # fmt: skip
    m = summarize_sessions(a + b, {"ttft_ms": 200})
    assert m["sessions"] == 2
    assert m["session_goodput"] == 0.0  # a: turn 2's TTFT 300 ms > 200; b: a failed turn
    assert summarize_sessions(a, {"ttft_ms": 400})["session_goodput"] == 1.0
    # a: wall 1.0 -> 3.0 = 2.0 s, model 1.0, tool 0.8, waiting 0.2
    one = summarize_sessions(a, {})
    assert one["session_wall_s_p50"] == pytest.approx(2.0)
    assert one["session_model_s_mean"] == pytest.approx(1.0)
    assert one["session_tool_s_mean"] == pytest.approx(0.8)
    assert one["session_wait_s_mean"] == pytest.approx(0.2)
    assert one["ttft_ms_p50_turn1"] == pytest.approx(100) and one["ttft_ms_p50_turn2_4"] == 300
    assert one["ttft_ms_p50_ctx_lt1k"] == 100 and one["ttft_ms_p50_ctx_1k_4k"] == 300
    assert one["ttft_ms_p50_turn5_8"] is None
    rows = by_turn(a + b)
    assert rows["1"]["requests"] == 2 and rows["1"]["ttft_ms_p50"] == pytest.approx(100)
    assert rows["2"]["requests"] == 2 and rows["2"]["ttft_ms_p50"] == pytest.approx(300)


def test_buckets() -> None:
    assert [bucket(t, TURN_BUCKETS) for t in (1, 2, 4, 5, 8, 9, 16, 17, 99)] == [
        "turn1", "turn2_4", "turn2_4", "turn5_8", "turn5_8", "turn9_16", "turn9_16", "turn17p",
        "turn17p",
    ]  # fmt: skip
    assert [bucket(n, CTX_BUCKETS) for n in (0, 1023, 1024, 4096, 16384, 65536)] == [
        "ctx_lt1k", "ctx_lt1k", "ctx_1k_4k", "ctx_4k_16k", "ctx_16k_64k", "ctx_ge64k",
    ]  # fmt: skip
    assert bucket(None, CTX_BUCKETS) is None
