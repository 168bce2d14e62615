"""How many sandbox starts may be under way at once: fixed, or adaptive to their latency.

512 rollouts released together each start a sandbox; on 2 cores, 512 starts in flight make
every one of them take seconds (the kernel's namespace, mount and cgroup work and the forks all
contend), and the first rollout can call the model only when almost all have started. Bounding
the starts in flight lets each finish in about its uncontended time, so rollouts reach
generation in a steady stream while the rest queue.

The adaptive bound is a gradient limiter (the scheme of Netflix's concurrency-limits): it keeps
the shortest start seen (the uncontended cost) and a moving average of recent ones; while the
average stays within `tolerance` x the shortest, the bound grows by about one per start, and
when starts slow down beyond it the bound shrinks in proportion. It begins at twice the cores
and stays within [1, `ceiling`]. The wait for a slot is the rollout's `setup_wait` (pool).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections import deque


def default_start_limit() -> int:
    """Where the adaptive bound begins: two starts per core (one in the kernel, one forking)."""
    return 2 * (os.cpu_count() or 1)


class StartLimiter:
    """At most `limit` starts in flight; `adaptive` moves `limit` with the measured latency.

    Use as `async with limiter.slot() as slot:` around one start; `slot.waited_s` is how long
    it queued. Fair: waiters are served in arrival order (asyncio's FIFO wake-up).
    """

    def __init__(
        self,
        limit: int | None = None,
        *,
        adaptive: bool = True,
        ceiling: int | None = None,
        tolerance: float = 2.0,
        smoothing: float = 0.2,
    ) -> None:
        start = limit if limit is not None else default_start_limit()
        if start < 1:
            raise ValueError(f"a start limit must be >= 1, not {start}")
        self.adaptive = adaptive
        self.ceiling = max(start, ceiling or 8 * (os.cpu_count() or 1))
        self.tolerance = tolerance
        self.smoothing = smoothing
        self._limit = float(start)
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shortest: float | None = None
        self._recent: float | None = None
        #: the limit after each adjustment (what a report or a test can read back)
        self.history: list[int] = [start]

    @property
    def limit(self) -> int:
        return max(1, int(self._limit))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def slot(self) -> _Slot:
        return _Slot(self)

    async def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self._in_flight >= self.limit or self._waiters:
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._in_flight -= 1  # granted, then cancelled: hand the slot on
                    self._wake()
                else:
                    self._waiters.remove(waiter)
                raise
        else:
            self._in_flight += 1
        return loop.time() - started

    def release(self, latency_s: float | None) -> None:
        """Give the slot back; `latency_s` is how long the start took (None: it failed, and
        says nothing about contention)."""
        self._in_flight -= 1
        if latency_s is not None and self.adaptive:
            self._observe(latency_s)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_flight += 1
                waiter.set_result(None)

    def _observe(self, latency_s: float) -> None:
        latency_s = max(latency_s, 1e-6)
        self._shortest = latency_s if self._shortest is None else min(self._shortest, latency_s)
        a = self.smoothing
        self._recent = latency_s if self._recent is None else (1 - a) * self._recent + a * latency_s
        gradient = max(0.5, min(1.0, self.tolerance * self._shortest / self._recent))
        target = self._limit * gradient + math.sqrt(self._limit)
        self._limit = min(float(self.ceiling), max(1.0, (1 - a) * self._limit + a * target))
        if self.limit != self.history[-1]:
            self.history.append(self.limit)


class _Slot:
    def __init__(self, limiter: StartLimiter) -> None:
        self.limiter = limiter
        self.waited_s = 0.0
        self._held_since = 0.0

    async def __aenter__(self) -> _Slot:
        self.waited_s = await self.limiter.acquire()
        self._held_since = asyncio.get_running_loop().time()
        return self

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        took = asyncio.get_running_loop().time() - self._held_since
        self.limiter.release(took if exc_type is None else None)
