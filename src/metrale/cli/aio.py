"""Running a command's async work: one event loop, SIGTERM unwinding like Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """asyncio.run with SIGTERM treated like Ctrl-C, so every `finally` and `async with` unwinds."""

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await make()

    return asyncio.run(main())
