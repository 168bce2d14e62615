"""Teardown that completes: the one helper every stop on every exit path goes through.

The pool, the warm pool and the runner each await a sandbox's `stop()` (or a benchmark's
`cleanup()`) with `finish`, so a cancellation in the middle never leaves a sandbox running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def finish(awaitable: Awaitable[T]) -> T:
    """Await `awaitable` to its end even if the caller is cancelled meanwhile (again and again:
    asyncio.run cancels what is left at exit); the cancellation is raised once it is done.

    This is what makes teardown (a runtime's `stop()`) complete on every exit path.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            # Set first: a cancellation that lands as the work ends is raised too, not lost.
            cancelled = True
            if task.done():
                if task.cancelled():
                    raise
                result = task.result()
                break
    if cancelled:
        raise asyncio.CancelledError
    return result
