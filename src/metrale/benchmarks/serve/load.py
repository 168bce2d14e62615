"""Load generation: arrival processes, one load level's schedule and stop rules, and the sweep.

A *level* is one load setting measured on its own: a fixed concurrency (N workers, each sending
its next request the moment its previous one ends) or a request rate (arrivals drawn from a
Poisson, gamma or constant process, optionally capped by `max_concurrency`). Each level has a
warm-up, a measured phase and a cool-down, each bounded by a count or a duration; only measured
requests enter the metrics. The cool-down keeps the load on while the last measured requests
finish, so they do not run against an emptier server than the rest.

The sweep (`sweep_rates`) follows guidellm's: a concurrency-1 level gives the lowest useful rate,
a saturating level (high concurrency) gives the highest throughput the server sustains, and
evenly spaced Poisson rates between them fill in the curve; the **knee** is the level whose
goodput is highest.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from metrale.benchmarks.serve.metrics import Phase, RequestRecord

Arrivals = Literal["poisson", "gamma", "constant"]


def arrival_gaps(
    kind: Arrivals, rate: float, rng: random.Random, burstiness: float = 1.0
) -> Iterator[float]:
    """Inter-arrival gaps (s) with mean 1/rate.

    - poisson: exponential gaps, Exp(rate); variance 1/rate².
    - gamma: Gamma(shape k = burstiness, scale θ = 1/(rate·k)); mean 1/rate, variance
      1/(k·rate²), so k < 1 is burstier than Poisson, k > 1 smoother, k = 1 is Poisson
      (vLLM's `--burstiness`).
    - constant: exactly 1/rate.
    """
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a positive number, got {rate}")
    if kind == "poisson":
        while True:
            yield rng.expovariate(rate)
    elif kind == "gamma":
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        theta = 1.0 / (rate * burstiness)
        while True:
            yield rng.gammavariate(burstiness, theta)
    elif kind == "constant":
        while True:
            yield 1.0 / rate
    else:
        raise ValueError(f"unknown arrival process {kind!r}")


@dataclass(frozen=True)
class Bound:
    """Stop after `count` requests or `duration_s` seconds, whichever comes first; both None
    means an empty phase."""

    count: int | None = None
    duration_s: float | None = None

    @property
    def empty(self) -> bool:
        return not self.count and not self.duration_s

    def reached(self, sent: int, elapsed_s: float) -> bool:
        if self.empty:
            return True
        if self.count is not None and sent >= self.count:
            return True
        return self.duration_s is not None and elapsed_s >= self.duration_s


@dataclass(frozen=True)
class LevelSpec:
    """One load setting: `concurrency` N, or `rate` req/s with its arrival process."""

    index: int
    label: str
    concurrency: int | None = None
    rate: float | None = None
    #: lanes of sessions (load=sessions, `lanes.run_lanes`); the bounds then count sessions
    lanes: int | None = None
    #: lanes start evenly spaced over this many seconds (0: all at once)
    ramp_s: float = 0.0
    arrivals: Arrivals = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    warmup: Bound = Bound()
    measure: Bound = Bound(count=100)
    cooldown: Bound = Bound()
    max_error_rate: float | None = None
    seed: int = 0
    #: a trace's arrivals: request i intended `offsets_s[i]` after the level starts (open loop)
    offsets_s: tuple[float, ...] | None = None


@dataclass
class LevelState:
    """Live counters of the level being run, read by the progress display."""

    spec: LevelSpec
    started: float = 0.0
    in_flight: int = 0
    sent: int = 0
    measured: list[RequestRecord] = field(default_factory=list)
    measured_sent: int = 0
    completions: list[float] = field(default_factory=list)
    stopped: str | None = None

    def recent_rate(self, now: float, span_s: float = 5.0) -> float:
        """Completions per second over the last `span_s` seconds (or since the level began)."""
        span = min(span_s, max(now - self.started, 1e-9))
        n = 0
        for t in reversed(self.completions):
            if now - t > span:
                break
            n += 1
        return n / span


SendFn = Callable[[RequestRecord], Awaitable[None]]


class Launch(Protocol):
    """One request made ready before it is due (its bytes encoded, its bookkeeping done):
    `fire` writes it at once, without waiting (stamping `record.send_s`), `finish` awaits its
    answer and fills the record. `serve.client.Launch` is the real one."""

    def fire(self) -> None: ...

    def finish(self) -> Awaitable[None]: ...


#: Makes a record's request ready (`Launch`); called before the request is due.
Prepare = Callable[[RequestRecord], Launch]


class _Later:
    """A plain `SendFn` as a `Launch`: nothing is ready ahead, the send is all in `finish`."""

    __slots__ = ("record", "send")

    def __init__(self, send: SendFn, record: RequestRecord) -> None:
        self.send, self.record = send, record

    def fire(self) -> None:
        return None

    def finish(self) -> Awaitable[None]:
        return self.send(self.record)


class Phases:
    """Which phase the next request belongs to; None when the level should stop sending."""

    def __init__(self, spec: LevelSpec, start: float) -> None:
        self.spec = spec
        self.phase: Phase = "warmup"
        self.phase_start = start
        self.phase_sent = 0
        self.stop = False
        self._advance(start)

    def _advance(self, now: float) -> None:
        bounds = {"warmup": self.spec.warmup, "measure": self.spec.measure}
        while self.phase in bounds and bounds[self.phase].reached(
            self.phase_sent, now - self.phase_start
        ):
            self.phase = "measure" if self.phase == "warmup" else "cooldown"
            self.phase_start, self.phase_sent = now, 0

    def next(self, now: float) -> Phase | None:
        if self.stop:
            return None
        self._advance(now)
        if self.phase == "cooldown" and self.spec.cooldown.reached(
            self.phase_sent, now - self.phase_start
        ):
            return None
        self.phase_sent += 1
        return self.phase


async def run_level(
    spec: LevelSpec,
    send: SendFn,
    on_record: Callable[[RequestRecord], None],
    state: LevelState,
    t0: float,
    early_stop: Callable[[LevelState], str | None] | None = None,
    prepare: Prepare | None = None,
) -> list[RequestRecord]:
    """Run one level to its end and return every measured record.

    `send` fills in a record (send time, chunks, error); `t0` is the run's perf_counter origin.
    With `prepare`, a request is made ready before it is due and written the moment it is
    (`Launch`), and a fixed concurrency's first requests leave as one wave (`_closed_loop`).
    The level ends when the cool-down bound is reached and every measured request has finished;
    cool-down requests still in flight then are cancelled (recorded with error "cancelled").
    An error rate above `max_error_rate` (checked from 10 measured completions on) stops it early,
    and so does `early_stop` when it names a reason (the capacity search's over-saturation).
    """
    start = time.perf_counter()
    state.started = start
    phases = Phases(spec, start)
    tasks: set[asyncio.Task[None]] = set()
    measured_left = 0
    all_measured_done = asyncio.Event()
    errors = 0
    ready_up: Prepare = prepare or (lambda record: _Later(send, record))

    async def one(record: RequestRecord, launch: Launch) -> None:
        nonlocal measured_left, errors
        state.in_flight += 1
        try:
            await launch.finish()
        except asyncio.CancelledError:
            record.error = record.error or "cancelled"
            record.end_s = time.perf_counter() - t0
            raise
        finally:
            state.in_flight -= 1
            on_record(record)
            now = time.perf_counter()
            state.completions.append(now)
            if record.phase == "measure":
                state.measured.append(record)
                measured_left -= 1
                if record.error is not None:
                    errors += 1
                done = len(state.measured)
                if (
                    spec.max_error_rate is not None
                    and done >= 10
                    and errors / done > spec.max_error_rate
                    and not phases.stop
                ):
                    phases.stop = True
                    state.stopped = f"error rate {errors / done:.2f} > {spec.max_error_rate:g}"
                elif early_stop is not None and not phases.stop:
                    reason = early_stop(state)
                    if reason is not None:
                        phases.stop = True
                        state.stopped = reason
                if measured_left == 0 and phases.phase == "cooldown":
                    all_measured_done.set()

    def admit(phase: Phase, intended: float) -> RequestRecord:
        nonlocal measured_left
        record = RequestRecord(
            level=spec.index, index=state.sent, phase=phase, intended_s=intended - t0,
            ready_s=intended - t0,
        )  # fmt: skip
        state.sent += 1
        if phase == "measure":
            measured_left += 1
            state.measured_sent += 1
        return record

    def track(coro: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    loop = _Loop(t0, phases, state, admit, ready_up, one, track, all_measured_done)
    if spec.concurrency is not None:
        await loop.closed(spec.concurrency)
    else:
        await loop.open(spec)
    # Stop sending; wait for the measured requests, then cancel the cool-down stragglers.
    phases.stop = True
    while measured_left > 0 and tasks:
        await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
    # One step for the tasks created last: a request fired just before must reach its
    # `finish`, whose cancellation closes the connection it was written on.
    await asyncio.sleep(0)
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return list(state.measured)


Admit = Callable[[Phase, float], RequestRecord]
Track = Callable[[Awaitable[None]], "asyncio.Task[None]"]
One = Callable[[RequestRecord, Launch], Awaitable[None]]


@dataclass
class _Loop:
    """The two ways a level sends: closed (N workers) and open (arrivals on a schedule)."""

    t0: float
    phases: Phases
    state: LevelState
    admit: Admit
    prepare: Prepare
    one: One
    track: Track
    all_measured_done: asyncio.Event

    async def closed(self, concurrency: int) -> None:
        """N workers; a worker's next request is intended (and ready) the moment its previous
        one ended, so the scheduling lag includes the event loop's delay in noticing that end.

        The N first requests are all due when the level starts: they are made ready before
        (records, bytes), the level's clock starts, and they are written back to back in one
        wave, each stamped as it goes, so that the last waits only for the writes before it, not
        for N coroutines' set-up. A worker then sends its next request in the step that saw its
        previous one end (no task in between)."""
        phases, t0 = self.phases, self.t0
        first: list[tuple[RequestRecord, Launch]] = []
        for _ in range(concurrency):
            phase = phases.next(time.perf_counter())
            if phase is None:
                break
            record = self.admit(phase, t0)
            first.append((record, self.prepare(record)))
        due = time.perf_counter()
        for _, launch in first:
            launch.fire()
        phases.phase_start = self.state.started = due
        for record, _ in first:
            record.intended_s = record.ready_s = due - t0

        async def worker(record: RequestRecord, launch: Launch) -> None:
            while True:
                await self.one(record, launch)
                if self.all_measured_done.is_set():
                    return
                ready = t0 + record.end_s if record.end_s is not None else time.perf_counter()
                phase = phases.next(time.perf_counter())
                if phase is None:
                    return
                record = self.admit(phase, ready)
                launch = self.prepare(record)
                launch.fire()

        await asyncio.gather(*(self.track(worker(r, launch)) for r, launch in first))

    async def open(self, spec: LevelSpec) -> None:
        """Arrivals on a seeded schedule (or a trace's offsets); with `max_concurrency`, an
        arrival waits for a slot and the wait is its queue wait. An arrival is written in the
        step that woke for it; its answer is awaited in a task of its own."""
        t0, phases = self.t0, self.phases
        if spec.offsets_s is not None:
            gaps = offset_gaps(spec.offsets_s)
        else:
            assert spec.rate is not None
            gaps = arrival_gaps(spec.arrivals, spec.rate, random.Random(spec.seed), spec.burstiness)
        slots = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None

        async def gated(record: RequestRecord) -> None:
            assert slots is not None
            async with slots:
                record.ready_s = max(time.perf_counter() - t0, record.intended_s)
                launch = self.prepare(record)
                launch.fire()
                await self.one(record, launch)

        intended = time.perf_counter()
        while not self.all_measured_done.is_set():
            intended += next(gaps)
            delay = intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            phase = phases.next(intended)
            if phase is None:
                return
            record = self.admit(phase, intended)
            if slots is None:
                launch = self.prepare(record)
                launch.fire()
                self.track(self.one(record, launch))
            else:
                self.track(gated(record))


def offset_gaps(offsets_s: tuple[float, ...]) -> Iterator[float]:
    """The gaps between a trace's offsets (the first from the level's start), then 0 for ever:
    the level's measured count (the trace's length) ends it."""
    prev = 0.0
    for t in offsets_s:
        yield t - prev
        prev = t
    while True:
        yield 0.0


def sweep_rates(lowest: float, saturation: float, levels: int) -> list[float]:
    """`levels` evenly spaced rates strictly between the concurrency-1 rate and saturation:
    lowest + (saturation − lowest) · i / (levels + 1), i = 1..levels."""
    if saturation <= lowest:
        return []
    return [lowest + (saturation - lowest) * i / (levels + 1) for i in range(1, levels + 1)]


def knee(goodputs: list[float | None]) -> int | None:
    """The index of the level with the highest goodput (the first among equals)."""
    best: int | None = None
    for i, g in enumerate(goodputs):
        if g is not None and (best is None or g > (goodputs[best] or 0.0)):
            best = i
    return best
