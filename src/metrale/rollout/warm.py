"""The warm pool (`--runtime-pool N`): sandboxes started ahead of the rollouts that will use them.

The pool holds the index iterator of a run: whenever a worker asks for its next rollout, the
pool has begun (or finished) starting the sandboxes of the next `size` rollouts, so the one
handed out is often ready already. Each sandbox is started for one rollout index, with that
rollout's own runtime config (`make_runtime(index)`), and is used by that rollout only, never
again: the rollout stops it as it would a sandbox it started itself.

What the record says: `pool_start_s` is the start the pool did ahead (with its start-slot
wait), outside the rollout's setup; setup holds only what the rollout still waited for it.
So a pooled run's setup p50 shows what the rollouts waited, and `pool_start` shows what the
sandboxes cost: the start is moved off the rollout's path, not made cheaper.

On every exit path `close()` leaves nothing: a start still under way is cancelled (its own
cleanup stops what it made), and a started sandbox no rollout claimed is stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from metrale.rollout.teardown import finish
from metrale.runtime.base import Runtime


@dataclass
class Warm:
    """A sandbox the pool started for one rollout."""

    runtime: Runtime
    #: seconds the pool's start took (its start-slot wait included)
    start_s: float
    #: failed start attempts the pool retried before this one
    retries: int


class WarmPool:
    """Starts the sandboxes of the next `size` rollouts of `indices` ahead of them."""

    def __init__(
        self,
        size: int,
        indices: Iterator[int],
        start: Callable[[int], Awaitable[Warm]],
    ) -> None:
        if size < 1:
            raise ValueError(f"a warm pool holds at least 1 sandbox, not {size}")
        self.size = size
        self._indices = indices
        self._start = start
        self._ahead: deque[tuple[int, asyncio.Task[Warm]]] = deque()
        self._every: list[asyncio.Task[Warm]] = []
        self._claimed: set[int] = set()  # id() of the Warm a rollout took
        self._closed = False

    def _fill(self) -> None:
        while not self._closed and len(self._ahead) < self.size:
            index = next(self._indices, None)
            if index is None:
                return
            task = asyncio.ensure_future(self._timed(index))
            self._every.append(task)
            self._ahead.append((index, task))

    async def _timed(self, index: int) -> Warm:
        started = time.perf_counter()
        warm = await self._start(index)
        warm.start_s = time.perf_counter() - started
        return warm

    def next(self) -> tuple[int, asyncio.Task[Warm]] | None:
        """The next rollout's index and the start of its sandbox (None: no rollout left)."""
        self._fill()
        if not self._ahead:
            return None
        item = self._ahead.popleft()
        self._fill()
        return item

    async def claim(self, start: asyncio.Task[Warm]) -> Warm:
        """Await the sandbox the pool is starting for a rollout; from here the rollout owns
        it (and stops it). A start that failed raises as a rollout's own start would."""
        warm = await start
        self._claimed.add(id(warm))
        return warm

    async def close(self) -> None:
        """Stop what no rollout took: cancel starts under way, stop unclaimed sandboxes."""
        self._closed = True
        for task in self._every:
            if not task.done():
                task.cancel()
        await finish(asyncio.gather(*self._every, return_exceptions=True))
        for task in self._every:
            if task.cancelled() or task.exception() is not None:
                continue
            warm = task.result()
            if id(warm) not in self._claimed:
                await finish(warm.runtime.stop())
        self._every.clear()
        self._ahead.clear()
