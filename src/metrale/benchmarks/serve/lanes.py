"""One load level of sessions: N lanes, each running one session after another.

With `ramp_s`, lane i begins i/N of the way through the ramp (N lanes all starting at once send
N first turns together, and N answers arrive together: a herd no agent fleet makes). A lane
starts session k (k counts sessions across lanes in start order), then sends its turns
one at a time: turn i is **intended** (and ready) `tool_s` after turn i-1 ended, so the tool
time is slept, and the **scheduling lag** (send − ready) is how late the event loop sent it. The
warm-up, measured and cool-down bounds count *sessions*; a session's turns share its phase. The
level ends when every measured session has ended; cool-down sessions still running then are
cancelled (their in-flight request recorded with error "cancelled"). A failed turn is data: the
session goes on with its next turn (the messages are the recording's, not the reply's).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

from metrale.benchmarks.serve.load import Launch, LevelSpec, LevelState, Phases
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.benchmarks.serve.sessions import Session, SessionSource, Turn

#: Sends one turn of a session and fills the record (errors in `record.error`, never raised).
TurnSend = Callable[[Session, Turn, RequestRecord], Awaitable[None]]
#: Makes a turn's request ready (its body encoded) before its tool time is over; the function
#: it returns is called when the turn is due, with its record, and gives the `Launch` to fire.
TurnPrepare = Callable[[Session, Turn], Callable[[RequestRecord], Launch]]
#: Says why a level should stop now (over-saturated, failed), or None; see `search`.
EarlyStop = Callable[[LevelState], str | None]


async def run_lanes(
    spec: LevelSpec,
    source: SessionSource,
    send: TurnSend,
    on_record: Callable[[RequestRecord], None],
    state: LevelState,
    t0: float,
    early_stop: EarlyStop | None = None,
    prepare: TurnPrepare | None = None,
) -> list[RequestRecord]:
    """Run one level of `spec.lanes` lanes to its end; return every measured record. With
    `prepare`, a turn is made ready before its tool time is slept, and written as the lane
    wakes: the lag is the loop's delay in waking it, not the turn's encoding."""
    assert spec.lanes is not None
    n_lanes = spec.lanes
    start = time.perf_counter()
    state.started = start
    phases = Phases(spec, start)
    numbers = itertools.count()
    measured_left = 0
    errors = 0
    finished = asyncio.Event()

    def note(record: RequestRecord) -> None:
        nonlocal errors
        on_record(record)
        state.completions.append(time.perf_counter())
        if record.phase != "measure" or (state.stopped and record.error == "cancelled"):
            return  # a level stopped early cancels what is in flight: not measured
        state.measured.append(record)
        errors += record.error is not None
        reason = None
        done = len(state.measured)
        if spec.max_error_rate is not None and done >= 10 and errors / done > spec.max_error_rate:
            reason = f"error rate {errors / done:.2f} > {spec.max_error_rate:g}"
        elif early_stop is not None:
            reason = early_stop(state)
        if reason is not None and state.stopped is None:
            state.stopped = reason
            finished.set()

    async def turn(
        session: Session,
        t: int,
        phase: str,
        ready: float,
        made: Callable[[RequestRecord], Launch] | None,
    ) -> RequestRecord:
        step = session.turns[t]
        record = RequestRecord(
            level=spec.index, index=state.sent, phase=phase,  # type: ignore[arg-type]
            intended_s=ready - t0, ready_s=ready - t0, session=session.id, turn=t + 1,
            tool_s=step.tool_s,
        )  # fmt: skip
        state.sent += 1
        if phase == "measure":
            state.measured_sent += 1
        state.in_flight += 1
        try:
            if made is None:
                await send(session, step, record)
            else:
                launch = made(record)
                launch.fire()
                await launch.finish()
        except asyncio.CancelledError:
            record.error = record.error or "cancelled"
            record.end_s = time.perf_counter() - t0
            raise
        finally:
            state.in_flight -= 1
            note(record)
        return record

    async def lane(i: int) -> None:
        nonlocal measured_left
        if spec.ramp_s > 0:  # lane i starts at i/N of the ramp: no herd of first turns
            await asyncio.sleep(start + spec.ramp_s * i / n_lanes - time.perf_counter())
        while not finished.is_set():
            phase = phases.next(time.perf_counter())
            if phase is None:
                return
            session = source.session(next(numbers))
            measured_left += phase == "measure"
            ready = time.perf_counter()
            for t, step in enumerate(session.turns):
                ready += step.tool_s
                made = prepare(session, step) if prepare is not None else None
                delay = ready - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                record = await turn(session, t, phase, ready, made)
                ready = t0 + record.end_s if record.end_s is not None else time.perf_counter()
            if phase == "measure":
                measured_left -= 1
                if measured_left == 0 and phases.phase == "cooldown":
                    finished.set()

    lanes = [asyncio.ensure_future(lane(i)) for i in range(n_lanes)]

    async def all_lanes() -> None:
        try:
            await asyncio.gather(*lanes)
        finally:
            finished.set()

    ender = asyncio.ensure_future(all_lanes())
    try:
        await finished.wait()
        bug = ender.exception() if ender.done() and not ender.cancelled() else None
        if bug is not None:  # a lane's own bug, not a failed request: the level cannot go on
            raise bug
    finally:
        ender.cancel()
        phases.stop = True
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
    return list(state.measured)
