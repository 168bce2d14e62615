"""What the prime runtimes of one run share: one `AsyncSandboxClient`, one readiness poller that
asks for up to 100 sandboxes' statuses per request, the run's labels, and the count of
creations the service refused (429) per rollout.

One client per run: its connection pools and its gateway-token cache serve every sandbox, and
1,024 rollouts make one client, not 1,024. One poller per run: 1,024 pending sandboxes cost
11 status requests per poll, not 1,024 (the service's own SDK polls one sandbox per call).
The session is closed when its last runtime stops.

Refusals are counted where they happen: a response hook on the SDK's HTTP client sees every
429 answer to `POST /sandbox`, the SDK's own retries included (it waits 10 s, then 30 s), and
adds it to the creation in flight in that task (a context variable), so each refused attempt is
one runtime retry on its rollout.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx
    from prime_sandboxes import AsyncSandboxClient

logger = logging.getLogger(__name__)

#: statuses a pending sandbox ends in
SETTLED = frozenset({"RUNNING", "ERROR", "TERMINATED", "TIMEOUT"})
#: the service's bound on one status batch
BATCH = 100
POLL_S = 0.5
#: control-plane requests (creations, readiness probes, deletions) in flight at once per run:
#: the SDK's HTTP pool (httpx) schedules queued requests in quadratic time, and 1,024 queued
#: at once kept a core busy there for minutes before the first sandbox was used
CONTROL_IN_FLIGHT = 64
#: every sandbox metrale makes carries this label, and the three below with their values
LABEL = "metrale"
RUN_PREFIX, PID_PREFIX, HOST_PREFIX = "metrale-run-", "metrale-pid-", "metrale-host-"


def host_label() -> str:
    return HOST_PREFIX + (re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60] or "unknown")


def run_labels(run: str) -> list[str]:
    """The labels naming a run and its owner process (pid and host), for `metrale cleanup`."""
    return [LABEL, RUN_PREFIX + run, f"{PID_PREFIX}{os.getpid()}", host_label()]


@dataclass
class Creation:
    """One rollout's sandbox creation: the refusals (429) the service answered it, and whether
    a request of it may have made a sandbox the creation has not returned yet (sent, and not
    refused): while so, cancelling it could orphan that sandbox."""

    refused: int = 0
    unsettled: bool = False


#: the creation the current task is making (set by `PrimeRuntime.start`)
CREATION: contextvars.ContextVar[Creation | None] = contextvars.ContextVar(
    "metrale_prime_creation", default=None
)


def _is_creation(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/sandbox")


async def _creation_sent(request: httpx.Request) -> None:
    creation = CREATION.get()
    if creation is not None and _is_creation(request):
        creation.unsettled = True


async def _creation_answered(response: httpx.Response) -> None:
    creation = CREATION.get()
    if creation is None or not _is_creation(response.request):
        return
    if response.status_code >= 400:  # refused: no sandbox was made
        creation.unsettled = False
        creation.refused += response.status_code == 429


@dataclass
class Session:
    """One run's client and poller, on one event loop."""

    client: AsyncSandboxClient
    loop: asyncio.AbstractEventLoop
    users: int = 0
    #: bounds the run's control-plane requests (`CONTROL_IN_FLIGHT`)
    control: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CONTROL_IN_FLIGHT))
    _waiting: dict[str, asyncio.Future[Any]] = field(default_factory=dict)
    _poller: asyncio.Task[None] | None = None

    @classmethod
    def open(cls) -> Session:
        """A client on the running loop, counting refused creations (`CREATION`)."""
        from prime_sandboxes import AsyncSandboxClient

        client = AsyncSandboxClient()
        client._auth_cache = _memory_auth_cache(client.client)
        hooks = client.client.client.event_hooks
        hooks["request"].append(_creation_sent)
        hooks["response"].append(_creation_answered)
        return cls(client=client, loop=asyncio.get_running_loop())

    async def settled(self, sandbox_id: str, deadline: float) -> Any:
        """The sandbox's status snapshot once it leaves PENDING/PROVISIONING; TimeoutError at
        `deadline` (monotonic)."""
        future = self._waiting.get(sandbox_id)
        if future is None:
            future = self._waiting[sandbox_id] = self.loop.create_future()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline - time.monotonic())
        finally:
            if future.done() or self._waiting.get(sandbox_id) is future:
                self._waiting.pop(sandbox_id, None)

    async def _poll(self) -> None:
        """While any sandbox is awaited: its status, in batches of up to 100 per request."""
        while self._waiting:
            await asyncio.sleep(POLL_S)
            ids = list(self._waiting)
            for at in range(0, len(ids), BATCH):
                batch = ids[at : at + BATCH]
                try:
                    answer = await self.client.get_sandbox_statuses(batch)
                except Exception as exc:  # a failed poll is retried at the next one
                    logger.info("prime: status poll of %d sandboxes failed: %r", len(batch), exc)
                    continue
                for snapshot in answer.statuses:
                    if str(getattr(snapshot.status, "value", snapshot.status)) in SETTLED:
                        self._resolve(snapshot.sandbox_id, snapshot)
                for error in answer.errors:
                    self._resolve(error.sandbox_id, error)

    def _resolve(self, sandbox_id: str, value: Any) -> None:
        future = self._waiting.pop(sandbox_id, None)
        if future is not None and not future.done():
            future.set_result(value)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await self.client.aclose()


def _memory_auth_cache_class() -> type:
    from prime_sandboxes.sandbox import AsyncSandboxAuthCache

    class MemoryAuthCache(AsyncSandboxAuthCache):
        """The SDK's gateway-token cache, in memory only. The SDK's own rewrites the whole of
        `~/.prime/sandbox_auth_cache.json` for every new sandbox, under one lock: at 1,024
        sandboxes (and the thousands of entries earlier runs leave there for an hour) that
        serialised every start, and it put gateway tokens on disk."""

        async def _ensure_loaded(self) -> None:
            self._loaded = True

        async def _save_cache(self) -> None:
            return None

    return MemoryAuthCache


def _memory_auth_cache(api: Any) -> Any:
    return _memory_auth_cache_class()(None, api)


class Sessions:
    """A run's sessions (one per event loop), shared by every copy of the run's config."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, Session] = {}
        #: the run's id on its sandboxes' labels
        self.run = uuid.uuid4().hex[:16]

    def acquire(self) -> Session:
        loop = asyncio.get_running_loop()
        session = self._by_loop.get(loop)
        if session is None:
            session = self._by_loop[loop] = Session.open()
        session.users += 1
        return session

    async def release(self, session: Session) -> None:
        session.users -= 1
        if session.users <= 0 and self._by_loop.get(session.loop) is session:
            del self._by_loop[session.loop]
            await session.close()
