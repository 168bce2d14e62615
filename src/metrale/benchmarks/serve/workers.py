"""serve's load spread over worker processes, when one event loop cannot keep up.

At 1,000 concurrent streams one process spends its time in the event loop: writing the first
1,000 requests takes ~6 ms even in one tight wave (each waits for the writes before it: its
scheduling lag), and every chunk costs ~15 µs of CPU. `--client-workers N` (or `auto`, one per
core; worth it only with cores to spare beside the server) runs a fixed-concurrency level as
N processes, the way AIPerf does: each has its own event loop, connection pool and share of
the concurrency and of the request counts, and sends its records back to the parent when its
share ends; the parent merges them (renumbered, in send order) and computes the level's
metrics over all of them, as for one process.

All processes read the same clock: `time.perf_counter()` is the system's monotonic clock, so a
record's times (since the run's `t0`) mean the same whichever process wrote it. The workers are
started and made ready (imports, connections) before the level's clock starts; a level's
start waits for every worker, so that they all begin at once. Every worker is stopped on every
path (`finally`: killed and reaped). Rate levels stay in one process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from metrale.benchmarks.serve.client import Launch, PreparedRequest, StreamClient
from metrale.benchmarks.serve.load import Bound, LevelSpec, LevelState, run_level
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.endpoint.client import ClientOptions, Target
from metrale.errors import UsageError

#: How long a worker may take to start (imports, connections) before the level gives up.
START_TIMEOUT_S = 120.0


def parse_workers(text: str) -> int:
    """`auto` (one per core) or a whole number >= 1."""
    if text.strip().lower() == "auto":
        return os.cpu_count() or 1
    if not text.strip().isdigit() or int(text) < 1:
        raise UsageError(f"client_workers {text!r}: accepted: auto or a whole number >= 1")
    return int(text)


def _split(total: int | None, shares: Sequence[int]) -> list[int | None]:
    """`total` cut in proportion to `shares`, the parts summing to it (None stays None)."""
    if total is None:
        return [None] * len(shares)
    whole = sum(shares)
    cuts = [round(total * sum(shares[: i + 1]) / whole) for i in range(len(shares))]
    return [b - a for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]


def shares(spec: LevelSpec, workers: int) -> list[LevelSpec]:
    """Each worker's part of a fixed-concurrency level: its concurrency, and the warm-up,
    measured and cool-down counts in proportion (durations are the level's)."""
    assert spec.concurrency is not None
    n = min(workers, spec.concurrency)
    conc = [spec.concurrency // n + (1 if i < spec.concurrency % n else 0) for i in range(n)]

    def bounds(bound: Bound) -> list[Bound]:
        return [Bound(c or None, bound.duration_s) for c in _split(bound.count, conc)]

    return [
        replace(spec, concurrency=c, warmup=w, measure=m, cooldown=d, seed=spec.seed + i)
        for i, (c, w, m, d) in enumerate(
            zip(conc, bounds(spec.warmup), bounds(spec.measure), bounds(spec.cooldown), strict=True)
        )
    ]


def _worker(
    conn: Connection, target: Target, options: ClientOptions, api: str,
    bodies: list[PreparedRequest], first: int, spec: LevelSpec, t0: float,
) -> None:  # fmt: skip
    """A worker process: ready (connections opened on a warm-up), then one `go`, then its
    share of the level; its records go back as dicts, or its error as text."""
    try:
        records = asyncio.run(_work(conn, target, options, api, bodies, first, spec, t0))
        conn.send(("done", [r.model_dump() for r in records]))
    except BaseException as exc:  # the parent names it; a worker never dies silently
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _work(
    conn: Connection, target: Target, options: ClientOptions, api: str,
    bodies: list[PreparedRequest], first: int, spec: LevelSpec, t0: float,
) -> list[RequestRecord]:  # fmt: skip
    async with StreamClient(target, options, api) as client:
        if spec.concurrency:  # opened ahead: the level's first wave is writes only
            await client.pool.open(spec.concurrency)
        conn.send(("ready", None))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)  # "go"
        state = LevelState(spec)
        records: list[RequestRecord] = []
        next_body = first

        def prepare(record: RequestRecord) -> Launch:
            nonlocal next_body
            body = bodies[next_body % len(bodies)]
            next_body += 1
            return client.launch(body, record, t0)

        async def send(record: RequestRecord) -> None:
            await prepare(record).finish()

        await run_level(spec, send, records.append, state, t0, prepare=prepare)
        return records


async def run_level_in_workers(
    spec: LevelSpec, workers: int, target: Target, options: ClientOptions, api: str,
    bodies: list[PreparedRequest], t0: float, state: LevelState,
    on_record: Callable[[RequestRecord], None],
) -> list[RequestRecord]:  # fmt: skip
    """Run `spec` (a fixed concurrency) over `workers` processes; every record, merged."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with a running loop
    loop = asyncio.get_running_loop()
    procs: list[Any] = []
    pipes: list[Connection] = []
    try:
        for i, part in enumerate(shares(spec, workers)):
            ours, theirs = context.Pipe()
            first = i * len(bodies) // max(workers, 1)
            proc = context.Process(
                target=_worker, args=(theirs, target, options, api, bodies, first, part, t0),
                daemon=True, name=f"metrale-serve-worker-{i}",
            )  # fmt: skip
            proc.start()
            theirs.close()
            procs.append(proc)
            pipes.append(ours)
        for pipe in pipes:  # every worker ready before the level starts
            _expect(await _recv(loop, pipe, START_TIMEOUT_S), "ready")
        state.started = time.perf_counter()
        for pipe in pipes:
            pipe.send("go")
        merged: list[RequestRecord] = []
        for pipe in pipes:
            got = _expect(await _recv(loop, pipe, None), "done")
            merged.extend(RequestRecord.model_validate(r) for r in got)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            await loop.run_in_executor(None, proc.join, 10)
        for pipe in pipes:
            pipe.close()
    merged.sort(key=lambda r: (r.send_s if r.send_s is not None else r.intended_s, r.index))
    for index, record in enumerate(merged):
        record.index = index
        on_record(record)
    state.sent = len(merged)
    state.measured = [r for r in merged if r.phase == "measure"]
    state.measured_sent = len(state.measured)
    return state.measured


async def _recv(loop: asyncio.AbstractEventLoop, pipe: Connection, timeout: float | None) -> Any:
    def wait() -> Any:
        if timeout is not None and not pipe.poll(timeout):
            raise RuntimeError(f"a serve worker did not start within {timeout:g} s")
        try:
            return pipe.recv()
        except EOFError:
            raise RuntimeError("a serve worker ended without its records") from None

    return await loop.run_in_executor(None, wait)


def _expect(message: Any, kind: str) -> Any:
    what, payload = message
    if what == "error":
        raise RuntimeError(f"a serve worker failed: {payload}")
    if what != kind:
        raise RuntimeError(f"a serve worker said {what!r}, expected {kind!r}")
    return payload
