"""The prime runtime: each rollout's sandbox on Prime Intellect's sandbox service, through its
official SDK (`prime-sandboxes`, the `prime` extra; `AsyncSandboxClient`).

Credentials and the address come from the SDK's own places (`PRIME_API_KEY`,
`PRIME_API_BASE_URL`, else `~/.prime/config.json`), never from the config: nothing of them
reaches run.json, a record, a log line or a sandbox's environment (only `env` goes in).

A start is: the run's throttle (`--runtime-rate`, in setup), a creation (`POST /sandbox`,
idempotent by key), then readiness from the run's one batched status poller
(`prime_session`), then one command proving the gateway answers. A refused creation (429:
the service's rate limit or quota) is backed off and retried until `start_timeout`, each
refusal counted as a runtime retry of the rollout (`start_retries`). A sandbox still pending
at `start_timeout` is a `runtime_start` error, and it is deleted. A creation still in flight
when its rollout is cancelled is deleted when it returns: `stop()` waits for it.

Commands go through the gateway's command stream (`bash -c`, the argv quoted); a timeout is
the service's own (it kills the command; exit 124, `timed_out`); a stream that breaks
mid-command, or a sandbox the service no longer runs, is `runtime_lost`. Output is capped on
this side, head and tail (`output_cap_bytes`). Files move by the gateway's upload and download.

Every sandbox carries labels naming the run and its owner (pid and host): `metrale cleanup
--runtime prime` deletes those of runs whose process is gone, in bulk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import posixpath
import shlex
import tempfile
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr

from metrale.backoff import backoff_s
from metrale.bounds import COUNT, CPUS, MEMORY_MB, TIMEOUT_S, Bound, pydantic_range
from metrale.errors import UsageError
from metrale.runtime.base import (
    Capability,
    CleanupReport,
    ProgramResult,
    Runtime,
    RuntimeBase,
    RuntimeConfig,
    RuntimeStartError,
    SandboxLostError,
    TaskSandbox,
    Throttle,
)
from metrale.runtime.prime_session import CREATION, Creation, Session, Sessions, run_labels
from metrale.runtime.procs import CappedBuffer

logger = logging.getLogger(__name__)

EXTRA = "pip install 'metrale[prime]'"
#: a command with no timeout still needs one on the wire (the SDK's default is 300 s)
NO_TIMEOUT_S = 7 * 24 * 3600
#: the longest wait between two creations the service refused
BACKOFF_MAX_S = 30.0
#: the sandbox's own processes before any command (its init, the service's agent), as
#: `pid:starttime` words: `kill_commands` spares them
BASELINE = r"""
for d in /proc/[0-9]*; do
  read -r s < "$d/stat" 2>/dev/null || continue; s=${s##*) }; set -- $s
  printf '%s:%s ' "${d#/proc/}" "${20}"
done
"""
#: `kill_commands`: every process but the baseline (`$METRALE_KEEP`) and this shell's
#: ancestors, three sweeps so a fork between two is caught by the next
KILL_COMMANDS = r"""
keep=" 1 $$ "; p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
  read -r s < /proc/$p/stat || break; s=${s##*) }; set -- $s; p=$2; keep="$keep$p "
done
for sweep in 1 2 3; do
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; case "$keep" in *" $p "*) continue;; esac
    read -r s < "$d/stat" 2>/dev/null || continue; s=${s##*) }; set -- $s
    case " $METRALE_KEEP " in *" $p:${20} "*) continue;; esac
    kill -9 "$p" 2>/dev/null
  done
done
exit 0
"""


class PrimeConfig(RuntimeConfig):
    """A sandbox on Prime Intellect's service per rollout (or on `metrale sandbox-sim prime`)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.TASK_IMAGE,
            Capability.NETWORK_OFF,
            Capability.NETWORK,
            Capability.REMOTE,
            Capability.LEFTOVERS,
            Capability.KILL_COMMANDS,
        }
    )
    type: Literal["prime"] = "prime"
    #: no bound of this machine's on starts in flight: a start here is a request and a wait on
    #: the service, not local work (the service's rate limit, and `--runtime-rate`, bound it)
    start_limit: int | None = Field(default=0, **pydantic_range(COUNT))
    image: str = Field(
        default="python:3.11-slim", description="the sandbox's image (a registry name)"
    )
    cpu_cores: float = Field(default=1.0, description="CPU cores", **pydantic_range(CPUS))
    memory_mb: int = Field(default=2048, description="memory", **pydantic_range(MEMORY_MB))
    timeout_minutes: int = Field(
        default=120,
        description="the service deletes a sandbox this long after its creation, whoever forgot it",
        **pydantic_range(Bound(1, 7 * 24 * 60, integer=True, unit="minutes")),
    )
    start_timeout: float = Field(
        default=300.0,
        description="seconds from a creation to a usable sandbox; past it: runtime_start, "
        "and the sandbox is deleted",
        **pydantic_range(TIMEOUT_S),
    )
    workdir: str = Field(
        default="/work", pattern="^/", description="where commands run unless told otherwise"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="variables set in every sandbox (--env)"
    )
    network: bool = Field(
        default=False,
        description="outbound network; off: created with network_allowlist=[] (no egress, DNS "
        "included), as every metrale runtime's sandbox is unless asked",
    )
    #: the run's client and poller: every copy of this config (one run) shares them
    _sessions: Sessions = PrivateAttr(default_factory=Sessions)

    @property
    def sessions(self) -> Sessions:
        return self._sessions

    def create(self, throttle: Throttle | None = None) -> Runtime:
        return PrimeRuntime(self, throttle)

    def check(self) -> None:
        check_prime()

    def image_form(self) -> str | None:
        return "tag"

    def for_task(self, task: TaskSandbox) -> RuntimeConfig:
        """The task's image (a registry name), WORKDIR, ENV, CPUs, memory; outbound network
        exactly when the task allows the internet."""
        update: dict[str, Any] = {"env": {**self.env, **task.env}, "network": task.internet}
        if task.image:
            update["image"] = task.image
        if task.workdir:
            update["workdir"] = task.workdir
        if task.cpus:
            update["cpu_cores"] = task.cpus
        if task.memory_mb:
            update["memory_mb"] = task.memory_mb
        return self.model_copy(update=update)

    def cleanup(self, report: CleanupReport, *, everything: bool = False) -> None:
        from metrale.runtime.prime_cleanup import clean_sandboxes

        check_prime()
        clean_sandboxes(report, everything=everything)


def check_prime() -> None:
    """The SDK, a key and a service that answers it, before any work; one line each."""
    try:
        from prime_sandboxes.core.config import Config
    except ImportError:
        raise UsageError(f"the prime runtime needs the prime extra: {EXTRA}") from None
    import httpx

    config = Config()
    if not config.api_key:
        raise UsageError(
            "prime runtime: no API key: set PRIME_API_KEY (or log in with the prime CLI)"
        )
    url = f"{config.base_url}/api/v1/sandbox"
    try:
        answer = httpx.get(
            url, params={"per_page": 1}, timeout=15,
            headers={"Authorization": f"Bearer {config.api_key}"},
        )  # fmt: skip
    except httpx.HTTPError as exc:
        raise UsageError(
            f"prime runtime: the service at {config.base_url} does not answer "
            f"({type(exc).__name__}); set PRIME_API_BASE_URL to where it is"
        ) from None
    if answer.status_code in (401, 403):
        raise UsageError(f"prime runtime: {config.base_url} refused PRIME_API_KEY (HTTP 401)")
    if answer.status_code >= 400:
        raise UsageError(f"prime runtime: {url} answered HTTP {answer.status_code}")


class PrimeRuntime(RuntimeBase):
    config: PrimeConfig

    def __init__(self, config: PrimeConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.sandbox_id: str | None = None
        #: creations the service refused (429) before this sandbox's was accepted
        self.start_retries = 0
        self._session: Session | None = None
        self._creating: asyncio.Task[str] | None = None
        self._creation: Creation | None = None
        self._stopped = False
        #: `BASELINE`'s words, taken when the sandbox was ready
        self._baseline = ""

    @property
    def _client(self) -> Any:
        if self._session is None or self.sandbox_id is None or self._stopped:
            raise RuntimeError("prime runtime is not started")
        return self._session.client

    async def start(self) -> None:
        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        deadline = time.monotonic() + self.config.start_timeout
        self._session = self.config.sessions.acquire()
        creation = self._creation = Creation()
        self._creating = asyncio.ensure_future(self._create(creation, deadline))
        try:
            # shielded: a cancelled rollout's creation still returns its id, for stop()
            self.sandbox_id = await asyncio.shield(self._creating)
        finally:
            self.start_retries = creation.refused
        try:
            status = await self._session.settled(self.sandbox_id, deadline)
        except TimeoutError:
            raise RuntimeStartError(
                f"sandbox {self.sandbox_id} still pending after {self.config.start_timeout:g} s"
            ) from None
        state = str(
            getattr(getattr(status, "status", None), "value", getattr(status, "status", ""))
        )
        if state != "RUNNING":
            why = getattr(status, "error_message", None) or getattr(status, "message", "")
            raise RuntimeStartError(f"sandbox {self.sandbox_id} is {state or 'gone'}: {why}")
        await self._ready(deadline)

    async def _create(self, creation: Creation, deadline: float) -> str:
        """The accepted creation's sandbox id; 429s backed off and retried until `deadline`."""
        from prime_sandboxes import APIError, CreateSandboxRequest

        assert self._session is not None
        request = CreateSandboxRequest(
            name=f"metrale-{self.config.sessions.run}",
            docker_image=self.config.image,
            cpu_cores=self.config.cpu_cores,
            memory_gb=self.config.memory_mb / 1024,
            timeout_minutes=self.config.timeout_minutes,
            environment_vars=dict(self.config.env) or None,
            network_allowlist=None if self.config.network else [],
            labels=run_labels(self.config.sessions.run),
            idempotency_key=uuid.uuid4().hex,  # a retried request is the same sandbox
        )
        CREATION.set(creation)
        attempt = 0
        while True:
            try:
                async with self._session.control:
                    sandbox = await self._session.client.create(request)
                return str(sandbox.id)
            except APIError as exc:
                if "HTTP 429" not in str(exc):
                    raise RuntimeStartError(f"prime: creation failed: {exc}") from None
                attempt += 1
                wait = backoff_s(attempt + 1, 1.0, BACKOFF_MAX_S, jitter=0.5)
                if time.monotonic() + wait > deadline:
                    raise RuntimeStartError(
                        f"prime: creations refused for {self.config.start_timeout:g} s: {exc}"
                    ) from None
                await asyncio.sleep(wait)

    async def _ready(self, deadline: float) -> None:
        """RUNNING can lead the gateway: one command proves it answers (and makes the
        workdir, and lists the sandbox's own processes), retried while the service says the
        sandbox is not reachable yet."""
        from prime_sandboxes import APIError, CommandTimeoutError, SandboxNotRunningError

        assert self._session is not None
        while True:
            try:
                async with self._session.control:
                    probe = await self._client.execute_command(
                        self.sandbox_id,
                        f"mkdir -p {shlex.quote(self.config.workdir)} && {BASELINE}",
                        timeout=60,
                    )
            except (APIError, SandboxNotRunningError, CommandTimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeStartError(f"prime: the sandbox never answered: {exc}") from None
                await asyncio.sleep(0.5)
                continue
            if probe.exit_code != 0:
                raise RuntimeStartError(f"prime: cannot make {self.config.workdir}: {probe.stderr}")
            self._baseline = probe.stdout.strip()
            return

    def _path(self, path: str) -> str:
        return posixpath.join(self.config.workdir, path)

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        from prime_sandboxes import APIError, CommandTimeoutError, SandboxNotRunningError

        client = self._client
        wire_timeout = NO_TIMEOUT_S if timeout is None else max(1, math.ceil(timeout))
        started = time.perf_counter()
        try:
            answer = await client.execute_command(
                self.sandbox_id, shlex.join(argv), working_dir=self._path(cwd or "."),
                env=dict(env or {}) or None, timeout=wire_timeout,
            )  # fmt: skip
        except CommandTimeoutError:
            return ProgramResult(
                exit_code=124, stdout="", stderr="", timed_out=True,
                duration_s=time.perf_counter() - started,
            )  # fmt: skip
        except SandboxNotRunningError as exc:
            raise SandboxLostError(f"the sandbox is gone: {exc}") from None
        except APIError as exc:
            raise SandboxLostError(f"the gateway was lost mid-command: {exc}") from None
        out, err = self._capped(answer.stdout), self._capped(answer.stderr)
        return ProgramResult(
            exit_code=answer.exit_code, stdout=out.text(), stderr=err.text(),
            duration_s=time.perf_counter() - started,
            stdout_dropped=out.dropped, stderr_dropped=err.dropped,
        )  # fmt: skip

    def _capped(self, text: str) -> CappedBuffer:
        buffer = CappedBuffer(self.config.output_cap_bytes)
        buffer.add(text.encode())
        return buffer

    async def read(self, path: str) -> bytes:
        from prime_sandboxes import APIError, SandboxNotRunningError

        client = self._client
        with tempfile.TemporaryDirectory(prefix="metrale-prime-") as tmp:
            local = os.path.join(tmp, "file")
            try:
                await client.download_file(self.sandbox_id, self._path(path), local)
            except SandboxNotRunningError as exc:
                raise SandboxLostError(f"the sandbox is gone: {exc}") from None
            except APIError as exc:
                raise FileNotFoundError(f"{path}: {exc}") from None
            return await asyncio.to_thread(_read_bytes, local)

    async def write(self, path: str, data: bytes | str) -> None:
        from prime_sandboxes import APIError

        payload = data.encode() if isinstance(data, str) else data
        target = self._path(path)
        try:
            await self._client.upload_bytes(
                self.sandbox_id, target, payload, posixpath.basename(target) or "file"
            )
        except APIError as exc:
            raise OSError(f"cannot write {path} in the sandbox: {exc}") from None

    async def kill_commands(self) -> None:
        result = await self.run(
            ["bash", "-c", KILL_COMMANDS], env={"METRALE_KEEP": self._baseline}, timeout=60
        )
        if result.exit_code != 0:
            raise SandboxLostError(f"killing the sandbox's commands failed: {result.stderr}")

    async def stop(self) -> None:
        """Delete the sandbox, also one whose creation was in flight (it is awaited; one only
        backing off between refused requests is cancelled)."""
        if self._stopped:
            return
        self._stopped = True
        session, self._session = self._session, None
        if session is None:
            return
        try:
            creating = self._creating
            if creating is not None and self.sandbox_id is None:
                if self._creation is not None and not self._creation.unsettled:
                    creating.cancel()  # between requests (a backoff): nothing was made
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    self.sandbox_id = await creating  # it may have made one: delete it
            if self.sandbox_id is not None:
                try:
                    async with session.control:
                        await session.client.delete(self.sandbox_id)
                except Exception as exc:  # the service's timeout_minutes deletes it anyway
                    logger.warning("prime: deleting sandbox %s failed: %r", self.sandbox_id, exc)
        finally:
            await self.config.sessions.release(session)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
