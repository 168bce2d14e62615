"""What every sandbox-service emulator shares: how it is served until cancelled, the env lines
a client needs, the loud answer to any call it does not implement, and `GET /_state`.

An emulator is an `Emulator`: `start(host, port)` returns its base URL, `client_env(url)` the
environment a client (the SDK) needs to reach it, `stop()` ends it. `serve_forever` prints
those lines first (so a parent process or a user can read them) and, on every exit path
(SIGINT, SIGTERM, an error), stops the emulator and deletes every sandbox still live.

HTTP emulators subclass `HttpEmulator`, which answers a route it does not know with 501 and
the route named (and logs it): when an SDK upgrade calls something new, a contract test fails
there instead of passing against a server that guessed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from metrale.sandbox_sim.backend import Backend
from metrale.sandbox_sim.faults import Faults

logger = logging.getLogger(__name__)


class Emulator(Protocol):
    backend: Backend

    async def start(self, host: str, port: int) -> str: ...

    def client_env(self, url: str) -> dict[str, str]: ...

    async def stop(self) -> None: ...


@web.middleware
async def loud_unimplemented(request: web.Request, handler: Handler) -> web.StreamResponse:
    """501 naming the route for anything the emulator does not implement (404/405 otherwise)."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        if request.match_info.route.resource is not None and isinstance(exc, web.HTTPNotFound):
            raise  # a known route's own 404 (e.g. no such sandbox)
        route = f"{request.method} {request.path}"
        logger.error("not implemented by the emulator: %s", route)
        return web.json_response(
            {"error": "not_implemented", "detail": f"the emulator does not implement {route}"},
            status=501,
        )


class HttpEmulator:
    """An aiohttp emulator: subclasses add their routes in `routes()`."""

    def __init__(self, backend: Backend, faults: Faults) -> None:
        self.backend = backend
        self.faults = faults
        self._runner: web.AppRunner | None = None
        self.url = ""

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """What `GET /_state` answers: the live sandboxes (subclasses add their own)."""
        return {
            "live": [
                {"id": s.id, "image": s.image, "labels": s.labels, "created_at": s.created_at}
                for s in self.backend.live()
            ],
            "refused": self.faults.refused,
        }

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def start(self, host: str, port: int) -> str:
        app = web.Application(middlewares=[loud_unimplemented], client_max_size=64 << 20)
        app.router.add_get("/_state", self._state)
        self.routes(app)
        # a client that goes away (its deadline) cancels its handler, and so its command
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

    def client_env(self, url: str) -> dict[str, str]:
        raise NotImplementedError

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve_forever(emulator: Emulator, name: str, host: str, port: int) -> None:
    """Serve until cancelled; print the address and the client's env lines first."""
    try:
        url = await emulator.start(host, port)
        print(f"metrale sandbox-sim {name} listening on {url} "
              f"(backend: {emulator.backend.kind})", flush=True)  # fmt: skip
        for key, value in emulator.client_env(url).items():
            print(f"{key}={value}", flush=True)
        await asyncio.Event().wait()
    finally:
        try:
            await emulator.stop()
        finally:
            await emulator.backend.close()
