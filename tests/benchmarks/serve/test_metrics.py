"""Metric formulas on hand-made chunk timelines, and the client's parsing of real SSE bytes."""

from __future__ import annotations

import asyncio
import json

import pytest

from metrale.benchmarks.serve.client import _read_events
from metrale.benchmarks.serve.metrics import (
    RequestRecord,
    itl_samples,
    measured_window,
    meets_slos,
    peak_output_tps,
    queue_wait,
    schedule_lag,
    spread_tokens,
    summarize,
    tpot,
)


def rec(**kw: object) -> RequestRecord:
    base: dict[str, object] = {
        "level": 0, "index": 0, "phase": "measure", "intended_s": 0.0, "ready_s": 0.0,
        "send_s": 0.0,
    }  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


# A reasoning chunk first, then content; the third chunk carries 2 tokens (speculative decoding).
TIMELINE = rec(
    intended_s=0.990,
    ready_s=0.995,
    send_s=1.000,
    end_s=1.210,
    ttft_s=0.10,
    ttfc_s=0.12,
    e2e_s=0.21,
    chunk_times_s=[0.10, 0.12, 0.16, 0.20],
    chunk_tokens=[1, 1, 2, 1],
    reasoning_chunks=1,
    output_tokens=5,
    token_source="usage",
)


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    assert tpot(TIMELINE) == pytest.approx((0.21 - 0.10) / (5 - 1))


def test_itl_divides_a_multi_token_chunk_gap_per_token() -> None:
    assert itl_samples(TIMELINE) == pytest.approx([0.02, 0.02, 0.02, 0.04])


def test_queue_wait_and_schedule_lag_split_the_client_side_delay() -> None:
    assert queue_wait(TIMELINE) == pytest.approx(0.005)
    assert schedule_lag(TIMELINE) == pytest.approx(0.005)


def test_one_token_requests_have_no_tpot_but_meet_a_tpot_slo() -> None:
    one = rec(ttft_s=0.05, e2e_s=0.05, chunk_times_s=[0.05], chunk_tokens=[1], output_tokens=1)
    assert tpot(one) is None
    assert meets_slos(one, {"tpot_ms": 1})
    assert not meets_slos(one, {"ttft_ms": 10})


def test_slos_each_must_hold() -> None:
    assert meets_slos(TIMELINE, {"ttft_ms": 100, "tpot_ms": 27.5, "e2e_ms": 210})
    assert not meets_slos(TIMELINE, {"ttft_ms": 99})
    assert not meets_slos(TIMELINE, {"tpot_ms": 27})
    assert not meets_slos(TIMELINE, {"itl_ms": 39})
    failed = rec(error="http_500: boom")
    assert not meets_slos(failed, {})


def test_spread_tokens_prefers_per_chunk_usage_then_an_even_spread() -> None:
    assert spread_tokens(3, 4, [1, 3, 4]) == [1, 2, 1]
    assert spread_tokens(4, 8, []) == [2, 2, 2, 2]
    assert spread_tokens(2, None, []) == [1, 1]
    assert spread_tokens(0, 5, []) == []


def test_summary_throughput_goodput_and_peak_over_the_window() -> None:
    # Two requests sent at t=0 and t=1, each 2 s long, 10 tokens over ten 0.2 s chunks.
    records = [
        rec(
            index=i,
            send_s=float(i),
            end_s=i + 2.0,
            ttft_s=0.2,
            e2e_s=2.0,
            output_tokens=10,
            prompt_tokens=7,
            token_source="usage",
            chunk_times_s=[0.2 * (k + 1) for k in range(10)],
            chunk_tokens=[1.0] * 10,
        )
        for i in range(2)
    ]
    records.append(rec(index=2, phase="warmup", send_s=0.0, end_s=0.1, error="x"))
    m = summarize(records, slos={"ttft_ms": 150})
    window = measured_window([r for r in records if r.phase == "measure"])
    assert window is not None and window.duration_s == pytest.approx(3.0)
    assert m["requests"] == 2 and m["errors"] == 0
    assert m["request_throughput"] == pytest.approx(2 / 3)
    assert m["output_throughput"] == pytest.approx(20 / 3)
    assert m["total_throughput"] == pytest.approx(34 / 3)
    assert m["goodput"] == 0.0
    assert summarize(records, slos={"ttft_ms": 250})["goodput"] == pytest.approx(2 / 3)
    assert summarize(records)["goodput"] == pytest.approx(2 / 3)  # no SLO: all successes count
    # Bucket [1, 2) holds chunks 5..9 of request 0 and 0..3 of request 1 (t = 1.2..1.8).
    assert peak_output_tps(records[:2], window) == 9
    assert m["ttft_ms_p50"] == pytest.approx(200.0)
    assert m["tpot_ms_p50"] == pytest.approx(1800 / 9)
    assert m["tokens_counted"] == 0


class _Body:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def iter_any(self):  # type: ignore[no-untyped-def]
        for piece in self.pieces:
            await asyncio.sleep(0.01)
            yield piece


class _Resp:
    def __init__(self, pieces: list[bytes]) -> None:
        self.content = _Body(pieces)


def _event(delta: dict[str, object], usage: dict[str, int] | None = None) -> bytes:
    chunk: dict[str, object] = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_client_parses_a_reasoning_prefix_and_multi_token_chunks() -> None:
    pieces = [
        _event({"role": "assistant"}),
        _event({"reasoning_content": "hmm"}, {"completion_tokens": 1}),
        _event({"content": "Hel"}, {"completion_tokens": 2}),
        # Two events in one read, the second split across reads.
        _event({"content": "lo wor"}, {"completion_tokens": 5}) + _event({"content": "ld"})[:20],
        _event({"content": "ld"})[20:][:-2] + b"\n\n" + b'data: {"choices":[],"usage":'
        b'{"prompt_tokens":3,"completion_tokens":6}}\n\ndata: [DONE]\n\n',
    ]
    record = rec()
    asyncio.run(_read_events(_Resp(pieces), record, 0.0))  # type: ignore[arg-type]
    assert record.error is None
    assert record.reasoning_chunks == 1
    assert len(record.chunk_times_s) == 4
    assert record.ttft_s == record.chunk_times_s[0] < record.ttfc_s == record.chunk_times_s[1]
    assert record.output_tokens == 6 and record.prompt_tokens == 3
    assert record.token_source == "usage"
    # Per-chunk usage covers 3 of 4 chunks: not all, so the even spread applies.
    assert record.chunk_tokens == [1.5] * 4


def test_client_counts_chunks_without_usage_and_flags_a_cut_stream() -> None:
    record = rec()
    pieces = [_event({"content": "a"}), _event({"content": "b"}), b"data: [DONE]\n\n"]
    asyncio.run(_read_events(_Resp(pieces), record, 0.0))  # type: ignore[arg-type]
    assert record.output_tokens == 2 and record.token_source == "counted"
    assert record.chunk_tokens == [1.0, 1.0]
    cut = rec()
    with pytest.raises(Exception, match="incomplete"):
        asyncio.run(_read_events(_Resp([_event({"content": "a"})]), cut, 0.0))  # type: ignore[arg-type]


def test_client_reads_completions_text_chunks() -> None:
    record = rec()
    text = b'data: {"choices": [{"index": 0, "text": "hi", "finish_reason": null}]}\n\n'
    pieces = [text, text, b"data: [DONE]\n\n"]
    asyncio.run(_read_events(_Resp(pieces), record, 0.0))  # type: ignore[arg-type]
    assert record.output_tokens == 2 and record.ttfc_s == record.ttft_s
