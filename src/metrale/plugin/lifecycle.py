"""The lifecycle every benchmark shares, written once: load, poll `next()`, clean up.

`BenchmarkBase` implements the `plugin.Benchmark` protocol around one coroutine, `run()`: the
first `next()` starts it in the background, each `next()` waits at most `poll_s` for it and
returns a live snapshot (`live()`) until it has finished (`final()`). `load()` runs the
benchmark's `prepare()` and opens the chat client from the handle (when the configuration calls
a model); `cleanup()` cancels the work, runs `teardown()` and closes the client, on every exit
path. A benchmark writes only what differs: its parameters, `run()`, and its snapshots.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from metrale.errors import UsageError
from metrale.plugin import (
    RUN_OPTIONS,
    BenchmarkResult,
    Descriptor,
    LogLine,
    Metric,
    ParamSpec,
    ParamValues,
    PluginHandle,
    validate_params,
)

if TYPE_CHECKING:
    from metrale.endpoint.client import ChatClient
    from metrale.runtime.base import RuntimeConfig


class BackgroundRun:
    """A benchmark's main coroutine, run once in the background while `next()` polls it."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self.started = 0.0
        self.ended = 0.0

    @property
    def started_yet(self) -> bool:
        return self._task is not None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the work started, frozen when it ended."""
        if not self.started:
            return 0.0
        return (self.ended or time.perf_counter()) - self.started

    def start(self, work: Coroutine[Any, Any, Any]) -> None:
        self.started = time.perf_counter()
        self._task = asyncio.create_task(work)
        self._task.add_done_callback(self._mark_end)

    def _mark_end(self, _task: asyncio.Task[Any]) -> None:
        self.ended = time.perf_counter()

    async def wait(self, timeout_s: float) -> bool:
        """True once the work has finished; its exception, if any, is raised here."""
        if self._task is None:
            raise RuntimeError("BackgroundRun.wait() before start()")
        done, _ = await asyncio.wait({self._task}, timeout=timeout_s)
        if done:
            self._task.result()
        return bool(done)

    def result(self) -> Any:
        if self._task is None:
            raise RuntimeError("BackgroundRun.result() before start()")
        return self._task.result()

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class BenchmarkBase:
    """The shared lifecycle (see the module docstring). Subclasses set `descriptor`, return
    their `parameters()` and `metrics()`, and write `run()`, `live()` and `final()`."""

    descriptor: ClassVar[Descriptor]
    #: the run-wide flags this benchmark honours (`plugin.RUN_OPTIONS`)
    options: ClassVar[frozenset[str]] = frozenset(RUN_OPTIONS)
    #: open `self.client` (the measuring chat client) in `load()` when a model is called
    chat_client: ClassVar[bool] = True
    #: how long one `next()` waits for the work before it returns a live snapshot
    poll_s: ClassVar[float] = 0.25

    def __init__(self) -> None:
        self.values = ParamValues()
        self.handle: PluginHandle | None = None
        self.client: ChatClient | None = None
        self.work = BackgroundRun()
        self.logs: list[LogLine] = []

    # ------------------------------------------------------------------ declarations

    def parameters(self) -> list[ParamSpec]:
        raise NotImplementedError

    def sweep_axes(self) -> list[str]:
        return []

    def metrics(self) -> list[Metric]:
        return []

    def configure(self, values: Mapping[str, object]) -> ParamValues:
        self.values = validate_params(self.parameters(), values)
        self.configured()
        return self.values

    def configured(self) -> None:
        """Checks across parameters, after each has been validated alone (UsageError)."""

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        if runtime is not None:
            raise UsageError(
                f"{self.descriptor.id} runs nothing in a sandbox, so it takes no --runtime"
            )
        return None

    def needs_model(self) -> bool:
        return True

    def calls_in_flight(self) -> int | None:
        """The most model calls this configuration makes at once (None: no bound): the
        embedded server gets that many slots. A rollout benchmark's bound by default, and never
        more than its rollouts (an unbounded run of 8 rollouts makes 8 calls at once at most)."""
        bounds = [self.values.get("max_concurrent"), self.values.get("rollouts")]
        ints = [b for b in bounds if isinstance(b, int) and not isinstance(b, bool)]
        return min(ints) if ints else None

    # ------------------------------------------------------------------ lifecycle

    async def load(self, handle: PluginHandle) -> None:
        self.handle = handle
        await self.prepare(handle)
        if self.chat_client and self.needs_model():
            from metrale.endpoint.client import ChatClient

            assert handle.target is not None, "a benchmark that calls a model needs a target"
            self.client = await ChatClient(handle.target, handle.client_options).__aenter__()

    async def prepare(self, handle: PluginHandle) -> None:
        """Once-per-run work before `run()` (a cache to warm, an image to build)."""

    async def run(self) -> None:
        raise NotImplementedError

    async def next(self) -> BenchmarkResult:
        if not self.work.started_yet:
            self.work.start(self.run())
        if not await self.work.wait(self.poll_s):
            return self.live()
        return self.final()

    def live(self) -> BenchmarkResult:
        raise NotImplementedError

    def final(self) -> BenchmarkResult:
        raise NotImplementedError

    async def cleanup(self) -> None:
        await self.work.cancel()
        try:
            await self.teardown()
        finally:
            if self.client is not None:
                client, self.client = self.client, None
                await client.__aexit__(None, None, None)

    async def teardown(self) -> None:
        """Undo `prepare()`: called once by `cleanup()`, whatever happened."""

    def log(self, message: str, level: Literal["info", "warn", "error"] = "info") -> None:
        self.logs.append(LogLine(level=level, message=message))
