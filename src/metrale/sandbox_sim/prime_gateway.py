"""The prime emulator's gateway: what the SDK reaches at the URL `POST /sandbox/{id}/auth`
hands it, with the sandbox's token. The Connect RPC server stream
`command_session.CommandSession/Start` (binary protobuf with the SDK's own messages: enveloped
frames, a start event, data events, an end event, then the end-of-stream frame whose JSON holds
any error), and multipart `upload` and `download` of files.

A command's deadline is the client's (`connect-timeout-ms`): past it the command is killed and
the stream ends with `deadline_exceeded`. A sandbox that died under a command ends it with
`not_found`; an injected gateway failure breaks the stream mid-command with no end at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import struct
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from metrale.runtime.base import ProgramResult, SandboxLostError
from metrale.sandbox_sim.backend import Backend, SandboxGone
from metrale.sandbox_sim.faults import Faults

if TYPE_CHECKING:
    from metrale.sandbox_sim.prime import PrimeSandbox

logger = logging.getLogger(__name__)

START_RPC = "command_session.CommandSession/Start"
PB_MODULE = "prime_sandboxes._proto.command_session.command_session_pb2"
#: one Connect data message carries at most this much output
CHUNK = 1 << 20


def _envelope(flags: int, payload: bytes) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def _end_stream(error: tuple[str, str] | None = None) -> bytes:
    body = {} if error is None else {"error": {"code": error[0], "message": error[1]}}
    return _envelope(0x02, json.dumps(body).encode())


class PrimeGateway:
    """The gateway's routes, mixed into `PrimeEmulator` (which holds the sandboxes)."""

    backend: Backend
    faults: Faults
    sandboxes: dict[str, PrimeSandbox]

    def gateway_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post(f"/gateway/{{ns}}/{{id}}/{START_RPC}", self.start_command)
        r.add_post("/gateway/{ns}/{id}/upload", self.upload)
        r.add_get("/gateway/{ns}/{id}/download", self.download)

    def _gateway_sandbox(self, request: web.Request) -> PrimeSandbox | None:
        """The running sandbox a gateway call names, or None (gone); 401 on a bad token."""
        sandbox = self.sandboxes.get(request.match_info["id"])
        if sandbox is None or sandbox.backend_id is None:
            return None
        if request.headers.get("Authorization") != f"Bearer {sandbox.token}":
            raise web.HTTPUnauthorized(text="bad gateway token")
        return sandbox

    async def start_command(self, request: web.Request) -> web.StreamResponse:
        pb: Any = importlib.import_module(PB_MODULE)  # the SDK's own messages

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
        now = datetime.now(UTC).isoformat()
        answer = {"success": True, "path": path, "size": len(data), "timestamp": now}
        return web.json_response(answer)

    async def download(self, request: web.Request) -> web.Response:
        sandbox = self._gateway_sandbox(request)
        if sandbox is None or sandbox.backend_id is None:
            return web.json_response({"error": "sandbox_terminated"}, status=410)
        try:
            data = await self.backend.read(sandbox.backend_id, request.query.get("path", ""))
        except OSError as exc:
            return web.json_response({"detail": str(exc)}, status=404)
        return web.Response(body=data, content_type="application/octet-stream")


def _data_events(pb: Any, result: ProgramResult) -> list[bytes]:
    events = []
    for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        data = text.encode()
        for offset in range(0, len(data), CHUNK):
            message = pb.StartResponse()
            setattr(message.event.data, stream, data[offset : offset + CHUNK])
            events.append(message.SerializeToString())
    return events
