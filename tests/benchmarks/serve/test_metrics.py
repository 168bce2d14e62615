"""Metric formulas on hand-made chunk timelines (the parsing of SSE bytes is tested in
tests/endpoint/test_stream.py, where it lives)."""

from __future__ import annotations

import pytest

from metrale.benchmarks.serve.metrics import (
    RequestRecord,
    itl_samples,
    measured_window,
    meets_slos,
    peak_output_tps,
    queue_wait,
    schedule_lag,
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


def test_latency_docs_say_what_the_stream_measures() -> None:
    """TTFT is the first output chunk (reasoning and tool calls count), as `endpoint.stream`
    defines it; the first content chunk is TTFC, a different number."""
    from metrale.benchmarks.serve.declared import METRICS
    from metrale.endpoint import stream

    docs = {m.name: m.doc for m in METRICS}
    assert "**TTFT** = first output chunk" in (stream.__doc__ or "")
    assert "first output chunk" in docs["ttft_ms_p50"]
    assert "content token" not in docs["ttft_ms_p50"]
    assert "consecutive output chunks" in docs["itl_ms_p50"]
