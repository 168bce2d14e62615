"""An emulator of Prime Intellect's sandbox service: the API subset `prime-sandboxes` 0.5.1's
`AsyncSandboxClient` calls for what metrale's prime runtime uses, with real sandboxes behind it.

Control plane (REST under `/api/v1`, `Authorization: Bearer <api key>`): `POST /sandbox`
(idempotent by `idempotency_key`), `GET`/`DELETE /sandbox/{id}`, `GET /sandbox` (by labels,
paged), bulk `DELETE /sandbox` (`sandbox_ids` or `labels`), `POST /sandbox/status:batchGet`
(at most 100 ids), `POST /sandbox/{id}/auth` (the gateway's URL and a token),
`GET /sandbox/{id}/error-context`. Data plane: the gateway (`prime_gateway`), at
`/gateway/<ns>/<sandbox id>/...` with the sandbox's token. Anything else answers 501 naming
the route.

A creation is answered at once with a PENDING sandbox; its real sandbox starts in the
background after the injected latency (`faults`), then it is RUNNING. Over the creation rate
or the quota: 429. A stuck creation stays PENDING until deleted. A sandbox deleted while its
start is in flight is deleted when the start returns, as the real service must. A sandbox
has the host's network unless its creation's egress rules deny everything
(`network_allowlist=[]`): then none but loopback; rules in between are refused (422), not
approximated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from metrale.sandbox_sim.backend import Backend
from metrale.sandbox_sim.faults import Faults
from metrale.sandbox_sim.prime_gateway import PrimeGateway
from metrale.sandbox_sim.server import HttpEmulator

logger = logging.getLogger(__name__)

API = "/api/v1"
#: the SDK's own bound on one status batch
BATCH_MAX = 100
DEFAULT_API_KEY = "sim-prime-key"
#: denylist entries that deny all egress (the service's documented "deny all": the whole IPv4
#: space, DNS included; `*` as its network command takes it)
DENY_ALL = frozenset({"0.0.0.0/0", "*"})


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
    #: the egress rules as created: `network_allowlist=[]` (or a denylist of everything) is
    #: no network; neither list, the service's default, is the host's network
    allowlist: list[str] | None = None
    denylist: list[str] | None = None
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
            "errorMessage": self.error_message, "networkAllowlist": self.allowlist,
            "networkDenylist": self.denylist,
        }  # fmt: skip

    @property
    def network(self) -> bool:
        return self.allowlist is None and not (set(self.denylist or ()) & DENY_ALL)


def egress_rules(body: dict[str, Any]) -> tuple[list[str] | None, list[str] | None] | str:
    """A creation's `(network_allowlist, network_denylist)`, or why the emulator refuses them.
    It gives a sandbox the host's network or none, so it takes what it can keep exactly: no
    lists, an empty allowlist, or a denylist that denies everything."""
    allow, deny = body.get("network_allowlist"), body.get("network_denylist")
    for name, value in (("network_allowlist", allow), ("network_denylist", deny)):
        if value is not None and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            return f"{name} must be a list of strings"
    if allow is not None and deny is not None:
        return "network_allowlist and network_denylist are mutually exclusive"
    if allow or (deny and not set(deny) & DENY_ALL):
        return (
            "metrale sandbox-sim prime gives a sandbox the host's network or none; egress "
            "rules other than none at all are not emulated (accepted: network_allowlist=[], "
            "a network_denylist with 0.0.0.0/0, or neither)"
        )
    return allow, deny


class PrimeEmulator(PrimeGateway, HttpEmulator):
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
        self.gateway_routes(app)

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
        rules = egress_rules(body)
        if isinstance(rules, str):
            return web.json_response({"detail": rules}, status=422)
        sandbox = PrimeSandbox(
            id=f"sb{uuid.uuid4().hex[:22]}",
            name=str(body.get("name", "")),
            image=image,
            cpu=float(body.get("cpu_cores", 1.0)),
            memory_gb=float(body.get("memory_gb", 1.0)),
            timeout_minutes=int(body.get("timeout_minutes", 60)),
            env={str(k): str(v) for k, v in (body.get("environment_vars") or {}).items()},
            labels=[str(label) for label in body.get("labels") or []],
            allowlist=rules[0],
            denylist=rules[1],
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
                network=sandbox.network,
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

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().stop()
