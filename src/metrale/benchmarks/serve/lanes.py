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

What a lane does with a session is a `SessionDrive`: `scripted` sends a synthetic or recorded
session's turns as described; the live source (`live`) runs a real agent whose every chat call
comes through the same `Turns` recorder, its tool time real and measured, not slept.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from metrale.benchmarks.serve.load import Launch, LevelSpec, LevelState, Phases, SendFn
from metrale.benchmarks.serve.metrics import Phase, RequestRecord
from metrale.benchmarks.serve.sessions import Session, SessionSource, Turn

#: Sends one turn of a session and fills the record (errors in `record.error`, never raised).
TurnSend = Callable[[Session, Turn, RequestRecord], Awaitable[None]]
#: Makes a turn's request ready (its body encoded) before its tool time is over; the function
#: it returns is called when the turn is due, with its record, and gives the `Launch` to fire.
TurnPrepare = Callable[[Session, Turn], Callable[[RequestRecord], Launch]]
#: Says why a level should stop now (over-saturated, failed), or None; see `search`.
EarlyStop = Callable[[LevelState], str | None]


class Turns(Protocol):
    """A lane's recorder of one session's turns: makes turn `turn`'s record (session id, turn
    index from 1, ready time on the perf_counter clock, tool time before it), has `send` fill
    it, counts it, and returns it (errors in `record.error`)."""

    async def __call__(
        self, session: str, turn: int, ready: float, tool_s: float, send: SendFn
    ) -> RequestRecord: ...


#: Runs session number k of the level (k counts sessions across lanes in start order) in its
#: phase, each chat call through `Turns`.
SessionDrive = Callable[[int, Phase, Turns], Awaitable[None]]


def scripted(
    source: SessionSource, send: TurnSend, t0: float, prepare: TurnPrepare | None = None
) -> SessionDrive:
    """A synthetic or recorded session: each turn `tool_s` after the previous one ended. With
    `prepare`, a turn is made ready before its tool time is slept, and written as the lane
    wakes: the lag is the loop's delay in waking it, not the turn's encoding."""

    async def drive(k: int, phase: Phase, turns: Turns) -> None:
        session = source.session(k)
        ready = time.perf_counter()
        for t, step in enumerate(session.turns):
            ready += step.tool_s
            made = prepare(session, step) if prepare is not None else None
            delay = ready - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            one = functools.partial(send, session, step) if made is None else _fired(made)
            record = await turns(session.id, t + 1, ready, step.tool_s, one)
            ready = t0 + record.end_s if record.end_s is not None else time.perf_counter()

    return drive


def _fired(made: Callable[[RequestRecord], Launch]) -> SendFn:
    async def one(record: RequestRecord) -> None:
        launch = made(record)
        launch.fire()
        await launch.finish()

    return one


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
    """Run one level of `spec.lanes` lanes of scripted sessions; return every measured record."""
    drive = scripted(source, send, t0, prepare)
    return await run_session_lanes(spec, drive, on_record, state, t0, early_stop)


async def run_session_lanes(
    spec: LevelSpec,
    drive: SessionDrive,
    on_record: Callable[[RequestRecord], None],
    state: LevelState,
    t0: float,
    early_stop: EarlyStop | None = None,
) -> list[RequestRecord]:
    """Run one level of `spec.lanes` lanes to its end; return every measured record."""
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
        phase: Phase, session: str, t: int, ready: float, tool_s: float, send: SendFn
    ) -> RequestRecord:
        record = RequestRecord(
            level=spec.index, index=state.sent, phase=phase, intended_s=ready - t0,
            ready_s=ready - t0, session=session, turn=t, tool_s=tool_s,
        )  # fmt: skip
        state.sent += 1
        if phase == "measure":
            state.measured_sent += 1
        state.in_flight += 1
        try:
            await send(record)
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
            measured_left += phase == "measure"
            await drive(next(numbers), phase, functools.partial(turn, phase))
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
