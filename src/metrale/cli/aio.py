"""Running a command's async work: one event loop, SIGTERM unwinding like Ctrl-C, child
processes watched by pidfd, and the cyclic garbage collector tuned for many objects in flight."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: Allocations (net of frees) of container objects between two young-generation collections
#: while a command's loop runs; CPython's default is 700. See `_collector`.
GC_YOUNG_THRESHOLD = 20_000


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """asyncio.run with SIGTERM treated like Ctrl-C, so every `finally` and `async with` unwinds."""

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
        with _pidfd_children(loop), _collector():
            return await make()

    try:
        return asyncio.run(main())
    finally:
        _restore_child_watcher()


_installed = False


@contextlib.contextmanager
def _collector() -> Iterator[None]:
    """With 1,024 rollouts in flight (tasks, futures, records, connections), CPython's default
    collector ran ~130 young and ~15 middle collections in `gsm8k --rollouts 1024`, scanning
    live objects over and over and finding almost no garbage (~2,000 objects in all): ~40 ms
    of the loop's ~300 ms of CPU. Objects made before the loop (modules, pydantic schemas)
    are frozen out of every collection, and a young collection waits for 20,000 allocations:
    8 collections, ~8 ms (`benchmarks/harness_cost.py`). Cyclic garbage then waits a little
    longer (at most ~20,000 objects); nothing else changes. Put back when the loop ends."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@contextlib.contextmanager
def _pidfd_children(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """On Python 3.11, asyncio waits for each child process in a thread of its own
    (`ThreadedChildWatcher`): a run with 512 sandboxes started one thread per sandbox process,
    and starting each cost the event loop's thread ~0.3 ms of waiting (13% of its time, by
    py-spy, in `gsm8k --runtime bwrap --rollouts 512`). A pidfd per child on this loop costs
    one fd and no thread; 3.12 does this by itself, so only 3.11 with pidfds changes here.
    The watcher stays attached until the loop has closed (children still exiting in asyncio's
    own shutdown are reaped), then `run_async` puts the default back."""
    global _installed
    if sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            os.close(os.pidfd_open(os.getpid()))  # a kernel without pidfds (< 5.3) keeps threads
            watcher = asyncio.PidfdChildWatcher()
            watcher.attach_loop(loop)
            asyncio.get_event_loop_policy().set_child_watcher(watcher)
            _installed = True
    yield


def _restore_child_watcher() -> None:
    global _installed
    if _installed:
        _installed = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # children the run already killed
            # None puts the default watcher back (CPython accepts it; typeshed does not say so)
            asyncio.get_event_loop_policy().set_child_watcher(None)  # type: ignore[arg-type]
