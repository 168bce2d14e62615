"""Arrival processes (fixed seeds, so the tolerances cannot flake), phases and stop rules."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time

import pytest

from metrale.benchmarks.serve.load import (
    Bound,
    LevelSpec,
    LevelState,
    arrival_gaps,
    knee,
    run_level,
    sweep_rates,
)
from metrale.benchmarks.serve.metrics import RequestRecord

N = 50_000


def gaps(kind: str, rate: float, burstiness: float = 1.0, seed: int = 7) -> list[float]:
    gen = arrival_gaps(kind, rate, random.Random(seed), burstiness)  # type: ignore[arg-type]
    return list(itertools.islice(gen, N))


def test_poisson_gaps_have_mean_and_variance_of_an_exponential() -> None:
    xs = gaps("poisson", 20.0)
    assert statistics.fmean(xs) == pytest.approx(1 / 20, rel=0.02)
    assert statistics.pvariance(xs) == pytest.approx(1 / 20**2, rel=0.05)


def test_poisson_counts_per_second_have_variance_equal_to_mean() -> None:
    times = list(itertools.accumulate(gaps("poisson", 50.0)))
    counts: dict[int, int] = {}
    for t in times[:-1]:
        counts[int(t)] = counts.get(int(t), 0) + 1
    per_s = list(counts.values())[:-1]
    assert statistics.fmean(per_s) == pytest.approx(50, rel=0.03)
    assert statistics.pvariance(per_s) / statistics.fmean(per_s) == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_keeps_the_rate_and_sets_burstiness(shape: float) -> None:
    xs = gaps("gamma", 10.0, burstiness=shape)
    assert statistics.fmean(xs) == pytest.approx(0.1, rel=0.03)
    cv2 = statistics.pvariance(xs) / statistics.fmean(xs) ** 2
    assert cv2 == pytest.approx(1 / shape, rel=0.08)


def test_constant_and_bad_rates() -> None:
    assert gaps("constant", 4.0)[:3] == [0.25, 0.25, 0.25]
    with pytest.raises(ValueError):
        next(arrival_gaps("poisson", 0.0, random.Random(0)))


def test_sweep_rates_lie_strictly_between_and_knee_is_peak_goodput() -> None:
    assert sweep_rates(10, 40, 2) == pytest.approx([20, 30])
    assert sweep_rates(10, 5, 3) == []
    assert knee([1.0, None, 3.0, 2.0, 3.0]) == 2
    assert knee([None]) is None


def test_bound_is_count_or_duration_whichever_first() -> None:
    assert Bound(count=3).reached(3, 0.0) and not Bound(count=3).reached(2, 99.0)
    assert Bound(duration_s=1.0).reached(0, 1.0)
    assert Bound(count=10, duration_s=1.0).reached(4, 1.5)
    assert Bound().empty and Bound().reached(0, 0.0)


def _fake_send(latency_s: float, fail_every: int = 0):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    peak = {"in_flight": 0, "now": 0}

    async def send(record: RequestRecord) -> None:
        record.send_s = time.perf_counter() - t0
        peak["now"] += 1
        peak["in_flight"] = max(peak["in_flight"], peak["now"])
        try:
            await asyncio.sleep(latency_s)
        finally:
            peak["now"] -= 1
        record.ttft_s = record.e2e_s = latency_s
        record.end_s = time.perf_counter() - t0
        if fail_every and record.index % fail_every == 0:
            record.error = "http_500: injected"

    return send, peak, t0


def test_closed_loop_keeps_concurrency_and_splits_phases() -> None:
    send, peak, t0 = _fake_send(0.01)
    seen: list[RequestRecord] = []
    spec = LevelSpec(index=0, label="c4", concurrency=4, warmup=Bound(count=8),
                     measure=Bound(count=40), cooldown=Bound(count=8))  # fmt: skip
    measured = asyncio.run(run_level(spec, send, seen.append, LevelState(spec), t0))
    assert len(measured) == 40 and all(r.phase == "measure" for r in measured)
    assert sum(r.phase == "warmup" for r in seen) == 8
    assert sum(r.phase == "cooldown" for r in seen) <= 8
    assert peak["in_flight"] == 4
    assert all(r.ready_s == r.intended_s for r in seen)


def test_closed_loop_fires_its_first_wave_before_awaiting_any_answer() -> None:
    """The N first requests are made ready, then written back to back (one wave, ready = the
    level's start for all); a worker's next request is written when its previous one ended."""
    t0 = time.perf_counter()
    events: list[tuple[str, int]] = []

    class Fake:
        def __init__(self, record: RequestRecord) -> None:
            self.record = record
            events.append(("prepare", record.index))

        def fire(self) -> None:
            events.append(("fire", self.record.index))
            self.record.send_s = time.perf_counter() - t0

        async def finish(self) -> None:
            await asyncio.sleep(0.005)
            self.record.ttft_s = self.record.e2e_s = 0.005
            self.record.end_s = time.perf_counter() - t0

    async def unused(record: RequestRecord) -> None:
        raise AssertionError("a level with `prepare` sends through it")

    seen: list[RequestRecord] = []
    spec = LevelSpec(index=0, label="c4", concurrency=4, measure=Bound(count=12))
    measured = asyncio.run(run_level(spec, unused, seen.append, LevelState(spec), t0,
                                     prepare=Fake))  # fmt: skip
    assert len(measured) == 12
    assert events[:8] == [("prepare", i) for i in range(4)] + [("fire", i) for i in range(4)]
    first = [r for r in seen if r.index < 4]
    assert len({r.ready_s for r in first}) == 1 and all(r.intended_s == r.ready_s for r in first)
    assert all(r.send_s is not None and r.send_s >= r.ready_s for r in seen)
    later = [r for r in seen if r.index >= 4]
    assert all(r.ready_s == r.intended_s for r in later)


def test_open_loop_with_a_cap_reports_queue_wait() -> None:
    send, peak, t0 = _fake_send(0.05)
    seen: list[RequestRecord] = []
    spec = LevelSpec(index=0, label="r", rate=200.0, arrivals="constant", max_concurrency=2,
                     measure=Bound(count=20))  # fmt: skip
    measured = asyncio.run(run_level(spec, send, seen.append, LevelState(spec), t0))
    assert len(measured) == 20
    assert peak["in_flight"] <= 2
    waits = sorted(r.ready_s - r.intended_s for r in measured)
    assert waits[-1] > 0.2  # 200/s offered, 40/s served: the queue grows
    lags = [r.send_s - r.ready_s for r in measured if r.send_s is not None]
    assert max(lags) < 0.05


def test_error_rate_stops_a_level() -> None:
    send, _, t0 = _fake_send(0.001, fail_every=1)
    spec = LevelSpec(index=0, label="c2", concurrency=2, measure=Bound(count=1000),
                     max_error_rate=0.5)  # fmt: skip
    state = LevelState(spec)
    measured = asyncio.run(run_level(spec, send, lambda r: None, state, t0))
    assert state.stopped is not None and "error rate" in state.stopped
    assert len(measured) < 30
