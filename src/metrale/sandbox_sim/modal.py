"""`metrale sandbox-sim modal`: a local stand-in for Modal's sandbox service that the unmodified
`modal` SDK (pinned: 1.6.4, its API is private) talks to over plaintext HTTP/2 when
`MODAL_SERVER_URL=http://127.0.0.1:P`.

It serves exactly the gRPC methods of `modal_proto`'s `ModalClient` that `Sandbox.create`,
`exec`, the filesystem API, `terminate`, `Sandbox.list` by tag, `App.lookup` and
`Image.from_registry` / `Image.from_dockerfile` call, and the task command router on the same
port (`modal_router`). Every other method answers UNIMPLEMENTED naming itself, and is logged:
an SDK upgrade that starts calling something new fails a test loudly.

Behind each sandbox is a real one (`backend`: bwrap by default, or the container engine); an
image is its Dockerfile's `FROM` name, mapped by the backend (`--image NAME=LOCAL`), never
pulled or built. The faults of the real service come from `faults`: creation latency drawn
from a distribution, a creation rate limit and a quota of live sandboxes (both answered
RESOURCE_EXHAUSTED), a fraction of creations stuck pending, routers lost mid-command (the task
gone: NOT_FOUND, its sandbox deleted). `SandboxList` and `GET /_state` on a side HTTP port
(printed as METRALE_SANDBOX_SIM_STATE) list the live sandboxes, so a test can assert that none
is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from metrale.sandbox_sim.modal_grpc import make_jwt, service, wide_server
from metrale.sandbox_sim.modal_router import OUTPUT_CAP_BYTES, Router, Task, env_of

if TYPE_CHECKING:
    from grpclib.server import Server, Stream

    from metrale.sandbox_sim.backend import Backend
    from metrale.sandbox_sim.faults import Faults

logger = logging.getLogger(__name__)

#: The image builder version the SDK is told the environment uses.
IMAGE_BUILDER_VERSION = "2025.06"
#: The token the emulator accepts unless given another.
DEFAULT_TOKEN = ("ak-metrale-sandbox-sim", "as-metrale-sandbox-sim")


def network_of(definition: Any) -> bool:
    """Whether a sandbox's definition asks for outbound network: `network_access` OPEN (or
    unset, the service's default) yes; BLOCKED, the legacy `block_network`, or an allowlist of
    nothing, no. An allowlist that names anything is refused (INVALID_ARGUMENT): the backend
    gives all of the host's network or none, and either would be a lie about the list."""
    from modal_proto import api_pb2

    kinds = api_pb2.NetworkAccess.NetworkAccessType
    access = definition.network_access
    if definition.block_network or access.network_access_type == kinds.BLOCKED:
        return False
    if access.network_access_type == kinds.ALLOWLIST:
        if access.allowed_cidrs or access.allowed_domains:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                "metrale sandbox-sim modal gives a sandbox the host's network or none; "
                "an outbound allowlist is not emulated (accepted: block_network, or neither)",
            )
        return False
    return True


@dataclass
class Box:
    """One sandbox as the service sees it."""

    sandbox_id: str
    app_id: str
    tags: dict[str, str]
    image: str
    workdir: str
    cpu: float
    memory_mb: int
    env: dict[str, str] = field(default_factory=dict)
    #: outbound network (the service's OPEN); False: BLOCKED (or the legacy block_network)
    network: bool = True
    created_at: float = field(default_factory=time.time)
    task_id: str = ""
    status: str = "pending"  # pending, running, terminated
    result: Any = None  # api_pb2.GenericResult once finished
    backend_id: str | None = None
    starting: asyncio.Task[None] | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)


class ModalEmulator:
    """The service's state and its gRPC handlers (`services()` for a grpclib `Server`)."""

    def __init__(
        self, backend: Backend, faults: Faults, token: tuple[str, str] = DEFAULT_TOKEN
    ) -> None:
        self.backend = backend
        self.faults = faults
        self.token = token
        self.router_url = ""
        self.state_url = ""
        self.apps: dict[str, str] = {}  # name -> app id
        self.images: dict[str, str] = {}  # image id -> the name the backend maps
        self.boxes: dict[str, Box] = {}
        self.tasks: dict[str, Task] = {}
        self.jwts: dict[str, str] = {}  # task id -> the JWT its router accepts
        self.unimplemented: list[str] = []
        self._expiring: set[asyncio.Future[None]] = set()
        self._server: Server | None = None
        self._state_runner: Any = None

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
            "refused": self.faults.refused,
            "backend_live": len(self.backend.live()),
            "unimplemented": sorted(set(self.unimplemented)),
        }

    async def lose(self, sandbox_id: str) -> None:
        """Drop a sandbox's router and sandbox, as a lost worker does (for tests)."""
        box = self.boxes[sandbox_id]
        if box.task_id in self.tasks:
            self.tasks[box.task_id].lost = True
        await self._terminate(box, status="TERMINATED", why="the worker was lost")

    # ------------------------------------------------------------------ serving

    async def start(self, host: str, port: int) -> str:
        """Serve the service and its router on `host:port` (gRPC, plaintext HTTP/2) and
        `GET /_state` on a port of its own; the service's URL."""
        from aiohttp import web

        self._server = wide_server(self.services())
        await self._server.start(host, port)
        # grpclib keeps its asyncio server private; with port 0 the bound port is only there
        listening: Any = self._server._server
        bound = listening.sockets[0].getsockname()
        url = f"http://{bound[0]}:{bound[1]}"
        self.router_url = url  # plaintext on loopback: the SDK accepts it there only
        app = web.Application()
        app.router.add_get("/_state", self._state)
        self._state_runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._state_runner.setup()
        site = web.TCPSite(self._state_runner, host, 0)
        await site.start()
        state = self._state_runner.addresses[0]
        self.state_url = f"http://{state[0]}:{state[1]}/_state"
        return url

    def client_env(self, url: str) -> dict[str, str]:
        return {
            "MODAL_SERVER_URL": url,
            "MODAL_TOKEN_ID": self.token[0],
            "MODAL_TOKEN_SECRET": self.token[1],
            "METRALE_SANDBOX_SIM_STATE": self.state_url,
        }

    async def _state(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(self.state())

    async def stop(self) -> None:
        """Stop serving and terminate every sandbox (the backend's `close` deletes any left)."""
        if self._server is not None:
            self._server.close()
        for box in list(self.boxes.values()):
            await self._terminate(box, status="TERMINATED", why="the emulator stopped")
        if self._state_runner is not None:
            await self._state_runner.cleanup()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # ------------------------------------------------------------------ wiring

    def services(self) -> list[Any]:
        from modal_proto import api_grpc
        from modal_proto import task_command_router_grpc as tcr

        router = Router(self.tasks, self._check_jwt, self.faults.gateway_fails, self._lose_task)
        return [
            service(api_grpc.ModalClientBase, self, self._check_token, self.unimplemented),
            service(tcr.TaskCommandRouterBase, router, None, self.unimplemented),
        ]

    def _check_token(self, stream: Stream[Any, Any]) -> None:
        """Every control-plane call carries a token (as the real service wants); with `token`
        set, exactly that one."""
        meta: Any = stream.metadata or {}
        given = (meta.get("x-modal-token-id"), meta.get("x-modal-token-secret"))
        if given != self.token:
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
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=make_jwt({"sub": "input"})))

    async def ImageGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        """Every image "builds" at once as its `FROM` name (or its base image's), which the
        backend maps to a local one; its other Dockerfile lines are not run (logged)."""
        from modal_proto import api_pb2

        req = await stream.recv_message()
        assert req is not None
        commands = list(req.image.dockerfile_commands)
        key = json.dumps([commands, [b.image_id for b in req.image.base_images]])
        image_id = f"im-{uuid.uuid5(uuid.NAMESPACE_URL, key).hex[:20]}"
        name = next((c.split()[1] for c in commands if c.upper().startswith("FROM ")), "")
        if not name or name == "base":
            name = next((self.images.get(b.image_id, "") for b in req.image.base_images), "")
        rest = [c for c in commands if c.strip() and not c.upper().startswith("FROM ")]
        if rest:
            logger.info("modal emulator: image %s (%s): not run: %s", image_id, name, rest)
        self.images[image_id] = name
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
        refused = self.faults.admit_creation(len(self.live()))
        if refused is not None:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, refused)
        d = req.definition
        res = d.resources
        network = network_of(d)
        box = Box(
            sandbox_id=f"sb-{uuid.uuid4().hex[:20]}",
            app_id=req.app_id,
            tags={t.tag_name: t.tag_value for t in req.tags},
            image=self.images.get(d.image_id, ""),
            workdir=d.workdir or "/work",
            cpu=res.milli_cpu / 1000 if res.milli_cpu else 1.0,
            memory_mb=res.memory_mb_max or res.memory_mb or 2048,
            env=env_of(req) if hasattr(req, "secret_sources") else {},
            network=network,
        )
        self.boxes[box.sandbox_id] = box
        latency, stuck = self.faults.creation_latency(), self.faults.stuck()
        box.starting = asyncio.create_task(self._start(box, latency, stuck))
        if d.timeout_secs:
            loop = asyncio.get_running_loop()
            loop.call_later(d.timeout_secs, self._expire, box)
        return box

    async def _start(self, box: Box, latency: float, stuck: bool) -> None:
        """Pending for the drawn latency, the real sandbox starting meanwhile: the service's
        creation takes the latency replayed (or the real start, when that is longer), not
        their sum. A stuck creation never gets a sandbox."""
        if stuck:
            await asyncio.Event().wait()  # pending until terminated

        async def make() -> None:
            box.backend_id = await self.backend.create(
                box.image, env=box.env, cpu=box.cpu, memory_mb=box.memory_mb,
                workdir=box.workdir, labels=box.tags, network=box.network,
            )  # fmt: skip

        await asyncio.gather(asyncio.sleep(latency), make())
        assert box.backend_id is not None
        runtime = self.backend.get(box.backend_id).runtime
        # a service streams all of a command's output; the runtime that reads it keeps its cap
        runtime.config.output_cap_bytes = OUTPUT_CAP_BYTES
        box.task_id = f"ta-{uuid.uuid4().hex[:20]}"
        self.tasks[box.task_id] = Task(box.task_id, runtime)
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
        return self.jwts.setdefault(task_id, make_jwt({"task_id": task_id}))

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
        # a client that stops waiting (its deadline) does not stop the termination
        ending = asyncio.ensure_future(self._terminate(box, status="TERMINATED", why="terminated"))
        self._expiring.add(ending)
        ending.add_done_callback(self._expiring.discard)
        await asyncio.shield(ending)
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
        if box.backend_id is not None:
            try:
                await self.backend.delete(box.backend_id)
            except Exception:
                logger.exception("modal emulator: stopping sandbox %s failed", box.sandbox_id)
        box.finished.set()

    async def _lose_task(self, task: Task) -> None:
        """A router lost mid-command (`--gateway-fail`): the task is gone, and its sandbox."""
        for box in self.boxes.values():
            if box.task_id == task.task_id:
                await self._terminate(box, status="TERMINATED", why="the worker was lost")
