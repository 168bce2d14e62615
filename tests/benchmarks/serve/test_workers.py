"""serve's load over worker processes: the shares add up, the records merge, and no worker is
left behind, whether the level ends or is cancelled."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from metrale.benchmarks.serve.client import StreamClient
from metrale.benchmarks.serve.load import Bound, LevelSpec, LevelState
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.benchmarks.serve.workers import parse_workers, run_level_in_workers, shares
from metrale.endpoint.client import ClientOptions, Target
from metrale.errors import UsageError
from tests.conftest import start_sim


def _children() -> list[int]:
    """This process's live children that are worker processes (multiprocessing's
    resource tracker, which lives as long as this process and ends with it, is not one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def test_shares_add_up_to_the_level() -> None:
    spec = LevelSpec(index=0, label="x", concurrency=7, warmup=Bound(5), measure=Bound(100),
                     cooldown=Bound(None, 2.0))  # fmt: skip
    parts = shares(spec, 3)
    assert [p.concurrency for p in parts] == [3, 2, 2]
    assert sum(p.measure.count or 0 for p in parts) == 100
    assert sum(p.warmup.count or 0 for p in parts) == 5
    assert all(p.cooldown.duration_s == 2.0 and p.cooldown.count is None for p in parts)
    assert len(shares(spec, 16)) == 7  # never more workers than streams
    assert parse_workers("auto") == (os.cpu_count() or 1) and parse_workers("2") == 2
    for bad in ("0", "two", "-1"):
        with pytest.raises(UsageError, match="auto or a whole number"):
            parse_workers(bad)


def _run(url: str, spec: LevelSpec, cancel_after: float | None = None):
    target = Target(base_url=url, model="metrale-sim")
    written: list[RequestRecord] = []

    async def go() -> list[RequestRecord]:
        async with StreamClient(target) as client:
            body = client.prepare({"model": target.model, "max_tokens": 8,
                                   "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
            level = run_level_in_workers(
                spec, 2, target, ClientOptions(), "chat", [body], time.perf_counter(),
                LevelState(spec), written.append,
            )  # fmt: skip
            if cancel_after is None:
                return await level
            task = asyncio.ensure_future(level)
            await asyncio.sleep(cancel_after)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return []

    return asyncio.run(go()), written


def test_two_workers_merge_every_record_and_leave_nothing_running() -> None:
    spec = LevelSpec(index=0, label="c4", concurrency=4, warmup=Bound(4), measure=Bound(12))
    with start_sim("--ttft", "0.05", "--output-tokens", "8") as sim:
        measured, written = _run(sim.url, spec)
    assert _children() == []
    assert len(measured) == 12 and all(r.ok for r in measured), [r.error for r in measured]
    assert len(written) == 16  # warm-up records are written too
    assert sorted(r.index for r in written) == list(range(16))
    assert all(len(r.chunk_times_s) == 8 and r.ttft_s is not None for r in measured)
    sends = [r.send_s for r in written]
    assert sends == sorted(sends)  # merged in send order, on one clock
    # a warm-up opened each worker's connections: no measured request paid a connect
    assert all(r.connect_s is None for r in measured)


def test_a_cancelled_level_stops_its_workers() -> None:
    spec = LevelSpec(index=0, label="c2", concurrency=2, measure=Bound(None, 30.0))
    with start_sim("--ttft", "0.5", "--output-tokens", "4") as sim:
        _run(sim.url, spec, cancel_after=4.0)
        assert _children() == []
