"""An emulator of Prime Intellect's sandbox service: the API subset `prime-sandboxes` 0.5.1's
`AsyncSandboxClient` calls for what metrale's prime runtime uses, with real sandboxes behind it.

Control plane (REST under `/api/v1`, `Authorization: Bearer <api key>`): `POST /sandbox`
(idempotent by `idempotency_key`), `GET`/`DELETE /sandbox/{id}`, `GET /sandbox` (by labels,
paged), bulk `DELETE /sandbox` (`sandbox_ids` or `labels`), `POST /sandbox/status:batchGet`
(at most 100 ids), `POST /sandbox/{id}/auth` (the gateway's URL and a token),
`GET /sandbox/{id}/error-context`. Data plane (the gateway, `/gateway/<ns>/<sandbox id>/...`
with the sandbox's token): the Connect RPC server stream `command_session.CommandSession/Start`
(binary protobuf with the SDK's own messages: a start event, data events, an end event), and
multipart `upload`, `download`. Anything else answers 501 naming the route.

A creation is answered at once with a PENDING sandbox; its real sandbox starts in the
background after the injected latency (`faults`), then it is RUNNING. Over the creation rate
or the quota: 429. A stuck creation stays PENDING until deleted. A sandbox deleted while its
start is in flight is deleted when the start returns, as the real service must.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import secrets
import struct
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from metrale.runtime.base import ProgramResult, SandboxLostError
from metrale.sandbox_sim.backend import Backend, SandboxGone
from metrale.sandbox_sim.faults import Faults
from metrale.sandbox_sim.server import HttpEmulator

logger = logging.getLogger(__name__)

API = "/api/v1"
START_RPC = "command_session.CommandSession/Start"
#: the SDK's own bound on one status batch
BATCH_MAX = 100
#: one Connect data message carries at most this much output
CHUNK = 1 << 20
DEFAULT_API_KEY = "sim-prime-key"
PB_MODULE = "prime_sandboxes._proto.command_session.command_session_pb2"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class PrimeSandbox:
    """The service's record of one sandbox (its real one, once started, is `backend_id`)."""

    id: str
    name: str
    image: str
    cpu: float
    memory_gb: float
    timeout_minutes: int
    env: dict[str, str]
    labels: list[str]
    created_at: str = field(default_factory=_now)
    status: str = "PENDING"
    started_at: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    backend_id: str | None = None
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    #: the background start (latency, then the real sandbox's start); None once done
    starting: asyncio.Task[None] | None = None
    #: the start is past its latency: cancelling it now could leave half a sandbox
    in_backend: bool = False
    deleted: bool = False

    def as_api(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "dockerImage": self.image, "cpuCores": self.cpu,
            "memoryGB": self.memory_gb, "diskSizeGB": 5.0, "diskMountPath": "/",
            "gpuCount": 0, "vm": True, "status": self.status,
            "timeoutMinutes": self.timeout_minutes, "environmentVars": self.env,
            "labels": self.labels, "createdAt": self.created_at, "updatedAt": _now(),
            "startedAt": self.started_at, "errorType": self.error_type,
            "errorMessage": self.error_message,
        }  # fmt: skip


def _envelope(flags: int, payload: bytes) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def _end_stream(error: tuple[str, str] | None = None) -> bytes:
    body = {} if error is None else {"error": {"code": error[0], "message": error[1]}}
    return _envelope(0x02, json.dumps(body).encode())


class PrimeEmulator(HttpEmulator):
    def __init__(self, backend: Backend, faults: Faults, api_key: str = DEFAULT_API_KEY) -> None:
        super().__init__(backend, faults)
        self.api_key = api_key
        self.sandboxes: dict[str, PrimeSandbox] = {}
        self._by_key: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def client_env(self, url: str) -> dict[str, str]:
        return {"PRIME_API_BASE_URL": f"{url}{API}", "PRIME_API_KEY": self.api_key}

    def state(self) -> dict[str, Any]:
        state = super().state()
        state["sandboxes"] = [
            {"id": s.id, "status": s.status, "labels": s.labels} for s in self.sandboxes.values()
        ]
        return state

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post(f"{API}/sandbox", self.create)
        r.add_get(f"{API}/sandbox", self.list_sandboxes)
        r.add_delete(f"{API}/sandbox", self.bulk_delete)
        r.add_post(f"{API}/sandbox/status:batchGet", self.statuses)
        r.add_get(f"{API}/sandbox/{{id}}", self.get)
        r.add_delete(f"{API}/sandbox/{{id}}", self.delete)
        r.add_post(f"{API}/sandbox/{{id}}/auth", self.auth)
        r.add_get(f"{API}/sandbox/{{id}}/error-context", self.error_context)
        r.add_post(f"/gateway/{{ns}}/{{id}}/{START_RPC}", self.start_command)
        r.add_post("/gateway/{ns}/{id}/upload", self.upload)
        r.add_get("/gateway/{ns}/{id}/download", self.download)

    # ------------------------------------------------------------------ control plane

    def _authorize(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            raise web.HTTPUnauthorized(
                text=json.dumps({"detail": "invalid API key"}), content_type="application/json"
            )

    def _sandbox(self, request: web.Request) -> PrimeSandbox:
        sandbox = self.sandboxes.get(request.match_info["id"])
        if sandbox is None:
            raise web.HTTPNotFound(
                text=json.dumps({"detail": "sandbox not found"}), content_type="application/json"
            )
        return sandbox

    async def create(self, request: web.Request) -> web.Response:
        self._authorize(request)
        body = await request.json()
        key = body.get("idempotency_key")
        if key and key in self._by_key and self._by_key[key] in self.sandboxes:
            return web.json_response(self.sandboxes[self._by_key[key]].as_api())
        refused = self.faults.admit_creation(len(self.sandboxes))
        if refused is not None:
            return web.json_response({"detail": refused}, status=429)
        image = body.get("docker_image")
        if not isinstance(image, str) or not image:
            return web.json_response({"detail": "docker_image is required"}, status=422)
        sandbox = PrimeSandbox(
            id=f"sb{uuid.uuid4().hex[:22]}",
            name=str(body.get("name", "")),
            image=image,
            cpu=float(body.get("cpu_cores", 1.0)),
            memory_gb=float(body.get("memory_gb", 1.0)),
            timeout_minutes=int(body.get("timeout_minutes", 60)),
            env={str(k): str(v) for k, v in (body.get("environment_vars") or {}).items()},
            labels=[str(label) for label in body.get("labels") or []],
        )
        self.sandboxes[sandbox.id] = sandbox
        if key:
            self._by_key[key] = sandbox.id
        sandbox.starting = self._spawn(self._start(sandbox))
        return web.json_response(sandbox.as_api())

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start(self, sandbox: PrimeSandbox) -> None:
        """Pending for the injected latency (forever if stuck), then the real sandbox."""
        if self.faults.stuck():
            await asyncio.Event().wait()
        await asyncio.sleep(self.faults.creation_latency())
        sandbox.in_backend = True
        try:
            backend_id = await self.backend.create(
                sandbox.image,
                env=sandbox.env,
                cpu=sandbox.cpu,
                memory_mb=max(64, int(sandbox.memory_gb * 1024)),
                labels={"prime_id": sandbox.id},
            )
        except Exception as exc:
            sandbox.status, sandbox.error_type = "ERROR", "SANDBOX_START_FAILED"
            sandbox.error_message = str(exc)[:500]
            logger.warning("sandbox %s did not start: %s", sandbox.id, exc)
            return
        finally:
            sandbox.starting = None
        if sandbox.deleted:  # deleted while it started: nothing may outlive the delete
            await self.backend.delete(backend_id)
            return
        sandbox.backend_id = backend_id
        sandbox.status, sandbox.started_at = "RUNNING", _now()
        self._spawn(self._expire(sandbox))

    async def _expire(self, sandbox: PrimeSandbox) -> None:
        """The service ends a sandbox at its `timeout_minutes`, whoever forgot it."""
        await asyncio.sleep(sandbox.timeout_minutes * 60)
        if not sandbox.deleted:
            await self._remove(sandbox)

    async def _remove(self, sandbox: PrimeSandbox) -> None:
        sandbox.deleted = True
        sandbox.status = "TERMINATED"
        self.sandboxes.pop(sandbox.id, None)
        if sandbox.starting is not None and not sandbox.in_backend:
            sandbox.starting.cancel()  # still in its latency: no real sandbox yet
        if sandbox.backend_id is not None:
            backend_id, sandbox.backend_id = sandbox.backend_id, None
            await self.backend.delete(backend_id)

    async def get(self, request: web.Request) -> web.Response:
        self._authorize(request)
        return web.json_response(self._sandbox(request).as_api())

    async def delete(self, request: web.Request) -> web.Response:
        self._authorize(request)
        sandbox = self._sandbox(request)
        await self._remove(sandbox)
        return web.json_response({"id": sandbox.id, "status": "TERMINATED"})

    def _matching(self, labels: list[str]) -> list[PrimeSandbox]:
        return [s for s in self.sandboxes.values() if set(labels) <= set(s.labels)]

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        self._authorize(request)
        found = self._matching(request.query.getall("labels", []))
        status = request.query.get("status")
        if status:
            found = [s for s in found if s.status == status]
        page = max(1, int(request.query.get("page", "1")))
        per_page = max(1, min(int(request.query.get("per_page", "50")), 1000))
        shown = found[(page - 1) * per_page : page * per_page]
        return web.json_response({
            "sandboxes": [s.as_api() for s in shown], "total": len(found), "page": page,
            "perPage": per_page, "hasNext": page * per_page < len(found),
        })  # fmt: skip

    async def bulk_delete(self, request: web.Request) -> web.Response:
        self._authorize(request)
        body = await request.json()
        ids, labels = body.get("sandbox_ids"), body.get("labels")
        if (ids is None) == (labels is None):
            return web.json_response(
                {"detail": "give exactly one of sandbox_ids or labels"}, status=422
            )
        failed: list[dict[str, str]] = []
        if ids is not None:
            doomed = [self.sandboxes[i] for i in ids if i in self.sandboxes]
            failed = [
                {"sandbox_id": i, "error": "not found"} for i in ids if i not in self.sandboxes
            ]
        else:
            doomed = self._matching([str(label) for label in labels])
        await asyncio.gather(*(self._remove(s) for s in doomed))
        return web.json_response({
            "succeeded": [s.id for s in doomed], "failed": failed,
            "message": f"{len(doomed)} sandbox(es) deleted",
        })  # fmt: skip

    async def statuses(self, request: web.Request) -> web.Response:
        self._authorize(request)
        ids = (await request.json()).get("sandbox_ids") or []
        if len(ids) > BATCH_MAX:
            return web.json_response({"detail": f"at most {BATCH_MAX} sandbox_ids"}, status=422)
        found = [self.sandboxes[i] for i in ids if i in self.sandboxes]
        return web.json_response({
            "statuses": [
                {"sandbox_id": s.id, "status": s.status, "error_type": s.error_type,
                 "error_message": s.error_message} for s in found
            ],
            "errors": [
                {"sandbox_id": i, "code": "NOT_FOUND", "message": "sandbox not found"}
                for i in ids if i not in self.sandboxes
            ],
        })  # fmt: skip

    async def auth(self, request: web.Request) -> web.Response:
        self._authorize(request)
        sandbox = self._sandbox(request)
        if sandbox.status != "RUNNING":
            return web.json_response({"detail": f"sandbox is {sandbox.status}"}, status=409)
        expires = datetime.now(UTC) + timedelta(hours=1)
        return web.json_response({
            "gateway_url": f"{self.url}/gateway", "user_ns": "sim", "job_id": sandbox.id,
            "token": sandbox.token, "expires_at": expires.isoformat().replace("+00:00", "Z"),
        })  # fmt: skip

    async def error_context(self, request: web.Request) -> web.Response:
        self._authorize(request)
        sandbox = self._sandbox(request)
        return web.json_response({
            "status": sandbox.status, "errorType": sandbox.error_type,
            "errorMessage": sandbox.error_message,
        })  # fmt: skip

    # ------------------------------------------------------------------ gateway

    def _gateway_sandbox(self, request: web.Request) -> PrimeSandbox | None:
        """The running sandbox a gateway call names, or None (gone); 401 on a bad token."""
        sandbox = self.sandboxes.get(request.match_info["id"])
        if sandbox is None or sandbox.backend_id is None:
            return None
        if request.headers.get("Authorization") != f"Bearer {sandbox.token}":
            raise web.HTTPUnauthorized(text="bad gateway token")
        return sandbox

    async def start_command(self, request: web.Request) -> web.StreamResponse:
        pb: Any = importlib.import_module(
            "prime_sandboxes._proto.command_session.command_session_pb2"
        )

        response = web.StreamResponse(headers={"Content-Type": "application/connect+proto"})
        try:
            sandbox = self._gateway_sandbox(request)
        except web.HTTPUnauthorized:
            return await self._finish(request, response, ("unauthenticated", "bad token"))
        if sandbox is None or sandbox.backend_id is None:
            return await self._finish(request, response, ("not_found", "sandbox not found"))
        raw = await request.read()
        start = pb.StartRequest()
        start.ParseFromString(raw[5:])
        spec = start.command
        deadline_ms = request.headers.get("connect-timeout-ms")
        timeout = int(deadline_ms) / 1000 if deadline_ms and deadline_ms.isdigit() else None
        await response.prepare(request)
        event = pb.StartResponse()
        event.event.start.pid = 1
        await response.write(_envelope(0, event.SerializeToString()))
        argv = [spec.cmd, *spec.args]
        if self.faults.gateway_fails():
            return await self._fail_gateway(request, response, sandbox, argv)
        try:
            result = await self.backend.exec(
                sandbox.backend_id, argv, env=dict(spec.envs), cwd=spec.cwd or None,
                timeout=timeout,
            )  # fmt: skip
        except (SandboxLostError, SandboxGone) as exc:
            if not sandbox.deleted:
                sandbox.status, sandbox.error_type = "TERMINATED", "SANDBOX_LOST"
                sandbox.error_message = str(exc)
            return await self._finish(request, response, ("not_found", f"sandbox lost: {exc}"))
        if result.timed_out:
            return await self._finish(request, response, ("deadline_exceeded", "timed out"))
        end = pb.StartResponse()
        end.event.end.exit_code = result.exit_code
        end.event.end.exited = True
        messages = [*_data_events(pb, result), end.SerializeToString()]
        with contextlib.suppress(ConnectionResetError):  # the client gave up (its deadline)
            for message in messages:
                await response.write(_envelope(0, message))
        return await self._finish(request, response, None)

    async def _fail_gateway(
        self,
        request: web.Request,
        response: web.StreamResponse,
        sandbox: PrimeSandbox,
        argv: list[str],
    ) -> web.StreamResponse:
        """The injected gateway failure: the command starts, then its stream breaks with no
        end message (the command is killed with it)."""
        assert sandbox.backend_id is not None
        run = asyncio.ensure_future(self.backend.exec(sandbox.backend_id, argv, timeout=60))
        await asyncio.sleep(0.05)
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
        logger.info("injected gateway failure mid-command in %s", sandbox.id)
        if request.transport is not None:
            request.transport.abort()
        return response

    async def _finish(
        self, request: web.Request, response: web.StreamResponse, error: tuple[str, str] | None
    ) -> web.StreamResponse:
        with contextlib.suppress(ConnectionResetError):  # the client gave up (its deadline)
            if not response.prepared:
                await response.prepare(request)
            await response.write(_end_stream(error))
            await response.write_eof()
        return response

    async def upload(self, request: web.Request) -> web.Response:
        sandbox = self._gateway_sandbox(request)
        if sandbox is None or sandbox.backend_id is None:
            return web.json_response({"error": "sandbox_terminated"}, status=410)
        path = request.query.get("path", "")
        data = b""
        reader = await request.multipart()
        async for part in reader:
            if getattr(part, "name", None) == "file":
                data = await part.read()  # type: ignore[union-attr]
        try:
            await self.backend.write(sandbox.backend_id, path, data)
        except OSError as exc:
            return web.json_response({"detail": str(exc)}, status=400)
        return web.json_response(
            {"success": True, "path": path, "size": len(data), "timestamp": _now()}
        )

    async def download(self, request: web.Request) -> web.Response:
        sandbox = self._gateway_sandbox(request)
        if sandbox is None or sandbox.backend_id is None:
            return web.json_response({"error": "sandbox_terminated"}, status=410)
        try:
            data = await self.backend.read(sandbox.backend_id, request.query.get("path", ""))
        except OSError as exc:
            return web.json_response({"detail": str(exc)}, status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().stop()


def _data_events(pb: Any, result: ProgramResult) -> list[bytes]:
    events = []
    for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        data = text.encode()
        for offset in range(0, len(data), CHUNK):
            message = pb.StartResponse()
            setattr(message.event.data, stream, data[offset : offset + CHUNK])
            events.append(message.SerializeToString())
    return events
