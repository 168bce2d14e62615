"""`metrale sandbox-sim modal`: a local stand-in for Modal's sandbox service that the unmodified
`modal` SDK (pinned: 1.6.4, its API is private) talks to over plaintext HTTP/2 when
`MODAL_SERVER_URL=http://127.0.0.1:P`.

It serves exactly the gRPC methods of `modal_proto`'s `ModalClient` that `Sandbox.create`,
`exec`, the filesystem API, `terminate`, `Sandbox.list` by tag, `App.lookup` and
`Image.from_registry` / `Image.from_dockerfile` call, and the task command router on the same
port (`modal_router`). Every other method answers UNIMPLEMENTED naming itself, and is logged:
an SDK upgrade that starts calling something new fails a test loudly.

Behind each sandbox is a real one (a metrale runtime, bwrap by default); the image name is
recorded, not pulled. The faults of the real service come from `ModalFaults`: creation latency
drawn from a distribution, a creation rate limit and a quota of live sandboxes (both answered
RESOURCE_EXHAUSTED), a fraction of creations stuck pending. `SandboxList` (and `GET /_state`
on the state port) lists the live sandboxes, so a test can assert that none is left.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import random
import secrets
import time
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from metrale.sandbox_sim.modal_router import Router, Task, env_of

if TYPE_CHECKING:
    from grpclib.server import Stream

    from metrale.runtime.base import Runtime

logger = logging.getLogger(__name__)

#: The image builder version the SDK is told the environment uses.
IMAGE_BUILDER_VERSION = "2025.06"
#: What `make_runtime(workdir)` must return: a started-on-demand metrale runtime.
MakeRuntime = Callable[[str], "Runtime"]


@dataclass
class ModalFaults:
    """What the real service does under load, replayed on demand (all off by default)."""

    create_latency: tuple[float, float] | None = None
    """(p50, p90) seconds from creation to running, log-normal."""
    create_rate: float | None = None
    """Creations per second (a bucket of one second's worth); beyond: RESOURCE_EXHAUSTED."""
    quota: int | None = None
    """Live sandboxes at once; a creation beyond: RESOURCE_EXHAUSTED."""
    stuck: float = 0.0
    """The fraction of creations that stay pending until terminated."""
    seed: int = 0

    def latency(self, rng: random.Random) -> float:
        if self.create_latency is None:
            return 0.0
        p50, p90 = self.create_latency
        sigma = math.log(max(p90, p50) / p50) / 1.2816 if p50 > 0 else 0.0
        return p50 * math.exp(rng.gauss(0.0, 1.0) * sigma) if p50 > 0 else 0.0


@dataclass
class Box:
    """One sandbox as the service sees it."""

    sandbox_id: str
    app_id: str
    tags: dict[str, str]
    image_id: str
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    task_id: str = ""
    status: str = "pending"  # pending, running, terminated
    result: Any = None  # api_pb2.GenericResult once finished
    runtime: Runtime | None = None
    starting: asyncio.Task[None] | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)


class ModalEmulator:
    """The service's state and its gRPC handlers (`services()` for a grpclib `Server`)."""

    def __init__(
        self,
        make_runtime: MakeRuntime,
        *,
        faults: ModalFaults | None = None,
        token: tuple[str, str] | None = None,
        router_url: str = "",
    ) -> None:
        self.make_runtime = make_runtime
        self.faults = faults or ModalFaults()
        self.token = token
        self.router_url = router_url
        self.apps: dict[str, str] = {}  # name -> app id
        self.images: dict[str, dict[str, Any]] = {}
        self.boxes: dict[str, Box] = {}
        self.tasks: dict[str, Task] = {}
        self.jwts: dict[str, str] = {}  # task id -> the JWT its router accepts
        self.unimplemented: list[str] = []
        self._rng = random.Random(self.faults.seed)
        self._bucket = (0.0, time.monotonic())  # (tokens, when)
        self.rejected = 0
        self._expiring: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------------ state

    def live(self) -> list[Box]:
        return [b for b in self.boxes.values() if b.status != "terminated"]

    def state(self) -> dict[str, Any]:
        """What `GET /_state` answers: live sandboxes and what the service refused."""
        return {
            "service": "modal",
            "live": [
                {"id": b.sandbox_id, "status": b.status, "app_id": b.app_id, "tags": b.tags}
                for b in self.live()
            ],
            "created": len(self.boxes),
            "rejected": self.rejected,
            "unimplemented": sorted(set(self.unimplemented)),
        }

    async def lose(self, sandbox_id: str) -> None:
        """Drop a sandbox's router and sandbox, as a lost worker does (for tests)."""
        box = self.boxes[sandbox_id]
        if box.task_id in self.tasks:
            self.tasks[box.task_id].lost = True
        await self._terminate(box, status="TERMINATED", why="the worker was lost")

    async def close(self) -> None:
        """Stop every sandbox (the emulator leaves nothing behind either)."""
        for box in list(self.boxes.values()):
            await self._terminate(box, status="TERMINATED", why="the emulator stopped")

    # ------------------------------------------------------------------ wiring

    def services(self) -> list[Any]:
        from modal_proto import api_grpc
        from modal_proto import task_command_router_grpc as tcr

        router = Router(self.tasks, self._check_jwt)
        return [
            _service(api_grpc.ModalClientBase, self, self._check_token, self.unimplemented),
            _service(tcr.TaskCommandRouterBase, router, None, self.unimplemented),
        ]

    def _check_token(self, stream: Stream[Any, Any]) -> None:
        """Every control-plane call carries a token (as the real service wants); with `token`
        set, exactly that one."""
        meta: Any = stream.metadata or {}
        given = (meta.get("x-modal-token-id"), meta.get("x-modal-token-secret"))
        if not all(given) or (self.token is not None and given != self.token):
            raise GRPCError(Status.UNAUTHENTICATED, "token missing or wrong")

    def _check_jwt(self, stream: Stream[Any, Any], task_id: str) -> None:
        meta: Any = stream.metadata or {}
        auth = meta.get("authorization", "")
        if task_id not in self.jwts or auth != f"Bearer {self.jwts[task_id]}":
            raise GRPCError(Status.UNAUTHENTICATED, f"no valid router token for task {task_id}")

    # ------------------------------------------------------------------ control plane

    async def ClientHello(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        await stream.recv_message()
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def AppGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        app_id = self.apps.get(req.app_name)
        if app_id is None:
            if req.object_creation_type != api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING:
                raise GRPCError(Status.NOT_FOUND, f"app {req.app_name!r} not found")
            app_id = self.apps[req.app_name] = f"ap-{uuid.uuid4().hex[:20]}"
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=app_id))

    async def EnvironmentGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        await stream.recv_message()
        settings = api_pb2.EnvironmentSettings(image_builder_version=IMAGE_BUILDER_VERSION)
        meta = api_pb2.EnvironmentMetadata(name="main", settings=settings)
        await stream.send_message(
            api_pb2.EnvironmentGetOrCreateResponse(environment_id="en-main", metadata=meta)
        )

    async def AuthTokenGet(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        await stream.recv_message()
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=_jwt({"sub": "input"})))

    async def ImageGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        """Every image "builds" at once: its Dockerfile lines and base are recorded; the
        sandbox behind is the backend's (a registry name maps to the local runtime)."""
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        commands = list(req.image.dockerfile_commands)
        key = json.dumps([commands, [b.image_id for b in req.image.base_images]])
        image_id = f"im-{uuid.uuid5(uuid.NAMESPACE_URL, key).hex[:20]}"
        self.images[image_id] = {"dockerfile_commands": commands}
        ok = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS)
        await stream.send_message(api_pb2.ImageGetOrCreateResponse(image_id=image_id, result=ok))

    async def ImageJoinStreaming(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        await stream.recv_message()
        ok = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS)
        await stream.send_message(api_pb2.ImageJoinStreamingResponse(result=ok, eof=True))

    async def SandboxCreate(self, stream: Stream[Any, Any]) -> None:
        """V1: the sandbox is pending when this returns; the SDK polls `SandboxGetTaskId`."""
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        box = self._create(req)
        await stream.send_message(api_pb2.SandboxCreateResponse(sandbox_id=box.sandbox_id))

    async def SandboxCreateV2(self, stream: Stream[Any, Any]) -> None:
        """V2 (the SDK's default): answers once the sandbox runs, with its task and the
        router's address and token; a creation stuck pending holds the call."""
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        box = self._create(req)
        assert box.starting is not None
        try:
            await asyncio.shield(box.starting)
        except asyncio.CancelledError:
            if box.starting.cancelled():
                raise GRPCError(
                    Status.ABORTED, f"sandbox {box.sandbox_id} was terminated"
                ) from None
            raise  # the client went away: the sandbox goes on, as the real service's would
        except Exception as exc:
            await self._terminate(box, status="FAILURE", why=f"sandbox failed to start: {exc}")
            raise GRPCError(Status.INTERNAL, f"sandbox failed to start: {exc}") from None
        await stream.send_message(
            api_pb2.SandboxCreateV2Response(
                sandbox_id=box.sandbox_id,
                task_id=box.task_id,
                command_router_access=api_pb2.CommandRouterAccess(
                    url=self.router_url, jwt=self._router_jwt(box.task_id)
                ),
            )
        )

    def _create(self, req: Any) -> Box:
        self._admit()
        d = req.definition
        box = Box(
            sandbox_id=f"sb-{uuid.uuid4().hex[:20]}",
            app_id=req.app_id,
            tags={t.tag_name: t.tag_value for t in req.tags},
            image_id=d.image_id,
            workdir=d.workdir or "/",
            env=env_of(req) if hasattr(req, "secret_sources") else {},
        )
        self.boxes[box.sandbox_id] = box
        stuck = self._rng.random() < self.faults.stuck
        box.starting = asyncio.create_task(self._start(box, self.faults.latency(self._rng), stuck))
        if d.timeout_secs:
            loop = asyncio.get_running_loop()
            loop.call_later(d.timeout_secs, self._expire, box)
        return box

    def _admit(self) -> None:
        """The creation limits of the real service: a rate and a quota of live sandboxes."""
        if self.faults.quota is not None and len(self.live()) >= self.faults.quota:
            self.rejected += 1
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "sandbox quota exceeded")
        rate = self.faults.create_rate
        if rate is None:
            return
        tokens, then = self._bucket
        now = time.monotonic()
        tokens = min(max(rate, 1.0), tokens + (now - then) * rate)
        if tokens < 1.0:
            self._bucket = (tokens, now)
            self.rejected += 1
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "rate limit exceeded: sandbox creation")
        self._bucket = (tokens - 1.0, now)

    async def _start(self, box: Box, latency: float, stuck: bool) -> None:
        await asyncio.sleep(latency)
        if stuck:
            await asyncio.Event().wait()  # pending until terminated
        runtime = self.make_runtime(box.workdir)
        box.runtime = runtime
        await runtime.start()
        box.task_id = f"ta-{uuid.uuid4().hex[:20]}"
        self.tasks[box.task_id] = Task(box.task_id, runtime, env=box.env)
        box.status = "running"

    def _expire(self, box: Box) -> None:
        if box.status != "terminated":
            self._expiring.add(
                asyncio.ensure_future(self._terminate(box, status="TIMEOUT", why="sandbox timeout"))
            )
            for done in [t for t in self._expiring if t.done()]:
                self._expiring.discard(done)

    async def SandboxGetTaskId(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        box = self._box(req.sandbox_id)
        if box.starting is not None and box.starting.done() and box.status == "pending":
            exc = box.starting.exception()
            await self._terminate(box, status="FAILURE", why=f"sandbox failed to start: {exc}")
        if box.result is not None:
            await stream.send_message(api_pb2.SandboxGetTaskIdResponse(task_result=box.result))
        else:
            await stream.send_message(api_pb2.SandboxGetTaskIdResponse(task_id=box.task_id))

    async def TaskGetCommandRouterAccess(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        jwt = self._router_jwt(req.task_id)
        await stream.send_message(
            api_pb2.TaskGetCommandRouterAccessResponse(jwt=jwt, url=self.router_url)
        )

    async def SandboxGetCommandRouterAccess(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        task_id = req.task_id or self._box(req.sandbox_id).task_id
        jwt = self._router_jwt(task_id)
        await stream.send_message(
            api_pb2.SandboxGetCommandRouterAccessResponse(jwt=jwt, url=self.router_url)
        )

    def _router_jwt(self, task_id: str) -> str:
        if task_id not in self.tasks or self.tasks[task_id].lost:
            raise GRPCError(Status.NOT_FOUND, f"task {task_id!r} not found")
        return self.jwts.setdefault(task_id, _jwt({"task_id": task_id}))

    async def SandboxWait(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        box = self._box(req.sandbox_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(box.finished.wait(), max(0.0, min(req.timeout, 50.0)))
        if box.result is None:
            await stream.send_message(api_pb2.SandboxWaitResponse())
        else:
            await stream.send_message(api_pb2.SandboxWaitResponse(result=box.result))

    async def SandboxTerminate(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        box = self._box(req.sandbox_id)
        await self._terminate(box, status="TERMINATED", why="terminated")
        await stream.send_message(api_pb2.SandboxTerminateResponse(existing_result=box.result))

    async def SandboxList(self, stream: Stream[Any, Any]) -> None:
        """Live sandboxes (of an app, carrying every tag asked for), newest first, in pages
        before `before_timestamp`."""
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        wanted = {t.tag_name: t.tag_value for t in req.tags}
        found = [
            b
            for b in self.boxes.values()
            if (req.include_finished or b.status != "terminated")
            and (not req.app_id or b.app_id == req.app_id)
            and all(b.tags.get(k) == v for k, v in wanted.items())
            and (not req.before_timestamp or b.created_at < req.before_timestamp)
        ]
        found.sort(key=lambda b: b.created_at, reverse=True)
        infos = [
            api_pb2.SandboxInfo(
                id=b.sandbox_id,
                created_at=b.created_at,
                app_id=b.app_id,
                tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in b.tags.items()],
                task_info=api_pb2.TaskInfo(id=b.task_id, result=b.result),
            )
            for b in found[:100]
        ]
        await stream.send_message(api_pb2.SandboxListResponse(sandboxes=infos))

    async def SandboxTagsGet(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        box = self._box(req.sandbox_id)
        tags = [api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in box.tags.items()]
        await stream.send_message(api_pb2.SandboxTagsGetResponse(tags=tags))

    # V2 sandboxes: the same calls under new names, the same messages
    SandboxGetTaskIdV2 = SandboxGetTaskId
    SandboxWaitV2 = SandboxWait
    SandboxTerminateV2 = SandboxTerminate
    SandboxListV2 = SandboxList
    SandboxTagsGetV2 = SandboxTagsGet

    def _box(self, sandbox_id: str) -> Box:
        box = self.boxes.get(sandbox_id)
        if box is None:
            raise GRPCError(Status.NOT_FOUND, f"sandbox {sandbox_id} not found")
        return box

    async def _terminate(self, box: Box, *, status: str, why: str) -> None:
        """Finish a sandbox once: its start cancelled, its real sandbox stopped."""
        from modal_proto import api_pb2

        if box.status == "terminated":
            return
        box.status = "terminated"
        code = getattr(api_pb2.GenericResult, f"GENERIC_STATUS_{status}")
        box.result = api_pb2.GenericResult(status=code, exception=why)
        if box.starting is not None and not box.starting.done():
            box.starting.cancel()
            with contextlib.suppress(BaseException):
                await box.starting
        task = self.tasks.get(box.task_id)
        if task is not None:
            task.lost = True
        if box.runtime is not None:
            try:
                await box.runtime.stop()
            except Exception:
                logger.exception("modal emulator: stopping sandbox %s failed", box.sandbox_id)
        box.finished.set()


def _jwt(claims: dict[str, Any]) -> str:
    """An unsigned JWT with an expiry an hour away (the SDK reads `exp` to know when to
    refresh; nothing here verifies the signature, the router compares the whole token)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    body = {**claims, "exp": int(time.time()) + 3600, "nonce": secrets.token_hex(8)}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(body)}.sig"


def _service(base: type, impl: Any, check: Callable[[Any], None] | None, missing: list[str]) -> Any:
    """A grpclib service of every method of `base`: `impl`'s where it has one, else a handler
    that answers UNIMPLEMENTED naming the method (and logs it)."""
    methods = {}
    for name in base.__abstractmethods__:  # type: ignore[attr-defined]
        found = getattr(impl, name, None)
        methods[name] = _guarded(found, check) if found else _unimplemented(missing, name)
    proxy = types.SimpleNamespace(**methods)

    class Service:
        def __mapping__(self) -> dict[str, Any]:
            mapping: dict[str, Any] = base.__mapping__(proxy)  # type: ignore[attr-defined]
            return mapping

    return Service()


def _guarded(handler: Any, check: Callable[[Any], None] | None) -> Any:
    async def call(stream: Stream[Any, Any]) -> None:
        if check is not None:
            check(stream)
        await handler(stream)

    return call


def _unimplemented(missing: list[str], name: str) -> Any:
    async def call(stream: Stream[Any, Any]) -> None:
        logger.error("modal emulator: %s is not implemented", name)
        missing.append(name)
        raise GRPCError(Status.UNIMPLEMENTED, f"modal emulator: {name} is not implemented")

    return call


async def serve(
    emulator: ModalEmulator,
    host: str,
    port: int,
    *,
    state_port: int | None = None,
    ready: Callable[[int, int | None], None] | None = None,
) -> None:
    """Serve `emulator` on `host:port` (gRPC, plaintext HTTP/2; its router on the same port)
    and `GET /_state` on `state_port`, until cancelled; then stop every sandbox."""
    from aiohttp import web
    from grpclib.server import Server

    server = Server(emulator.services())
    await server.start(host, port)
    bound = port or int(server._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]  # grpclib keeps its asyncio server private
    emulator.router_url = emulator.router_url or f"http://{host}:{bound}"
    runner: web.AppRunner | None = None
    state_bound: int | None = None
    try:
        if state_port is not None:
            app = web.Application()
            app.router.add_get("/_state", lambda _req: _state_response(emulator))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, state_port)
            await site.start()
            state_bound = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]  # aiohttp keeps its asyncio server private
        if ready is not None:
            ready(bound, state_bound)
        await asyncio.Event().wait()
    finally:
        server.close()
        await emulator.close()
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


async def _state_response(emulator: ModalEmulator) -> Any:
    from aiohttp import web

    return web.json_response(emulator.state())
