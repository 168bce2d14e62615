"""The modal runtime: one Modal sandbox per rollout, through the official SDK's `.aio` API
(extra `metrale[modal]`, pinned: the SDK's wire API is private).

- One app per run (`<app>-<run id>`), looked up once; every sandbox carries tags naming the
  run, its owner (pid and host) and itself (`metrale.box`), so `metrale cleanup --runtime
  modal` finds the sandboxes of dead runs, and a sandbox whose creation was interrupted before
  its id came back is still found and terminated.
- `start()` is `Sandbox.create("sleep", "infinity", ...)` of `Image.from_registry(image)` (or
  `Image.from_dockerfile(dockerfile)` for a task image). RESOURCE_EXHAUSTED (the service's
  creation rate limit or quota) is retried with exponential backoff and jitter, each retry
  counted (`start_retries`, added to the rollout's runtime retries); a sandbox not running
  within `start_timeout` is a `runtime_start` error and is terminated.
- Commands are `exec` with stdout and stderr streamed into capped buffers (head and tail kept,
  as every runtime does); files go through the SDK's filesystem API. A sandbox or router that
  goes away under a command is `runtime_lost`.
- Credentials stay in the SDK's own configuration (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET or its
  config file): the config holds none, and a sandbox gets only `env` and a command's own env.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import posixpath
import socket
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
    unknown_options,
)
from metrale.runtime.modal_service import (
    BOX_TAG,
    EXTRA,
    HOST_TAG,
    PID_TAG,
    RUN_TAG,
    STOP_TIMEOUT_S,
    TAG,
    brief,
    check_modal,
    clean_modal,
    terminate,
)
from metrale.runtime.procs import CappedBuffer

logger = logging.getLogger(__name__)

#: Backoff after a RESOURCE_EXHAUSTED creation: first wait, and the most any wait grows to.
BACKOFF_S = (0.5, 20.0)
#: Seconds past a command's timeout before the client stops waiting for the service's kill.
CLIENT_GRACE_S = 10.0
_LIMIT_KEYS = ("cpu_s", "max_procs", "file_size_mb")


class ModalConfig(RuntimeConfig):
    """A Modal sandbox per rollout, through the official SDK (extra `metrale[modal]`); the
    credentials are the SDK's own (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET or its config file)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.TASK_IMAGE,
            Capability.NETWORK_OFF,
            Capability.NETWORK,
            Capability.REMOTE,
            Capability.LEFTOVERS,
        }
    )
    type: Literal["modal"] = "modal"
    #: no bound of this machine's on starts in flight: a start here is a request and a wait on
    #: the service, not local work (the service's rate limit, and `--runtime-rate`, bound it)
    start_limit: int | None = Field(default=0, **pydantic_range(COUNT))
    image: str = Field(
        default="debian:bookworm-slim", description="registry image (Image.from_registry)"
    )
    dockerfile: str | None = Field(
        default=None, description="a Dockerfile to build the image from (Image.from_dockerfile)"
    )
    app: str = Field(default="metrale", description="app name prefix: one app <app>-<run> a run")
    cpu: float | None = Field(default=1.0, description="CPU cores reserved", **pydantic_range(CPUS))
    memory_mb: int | None = Field(
        default=2048,
        description="memory reserved and its limit (MiB)",
        **pydantic_range(MEMORY_MB),
    )
    timeout_s: int = Field(
        default=3600,
        description="the sandbox's lifetime: the service terminates it after this",
        **pydantic_range(Bound(10, 86400, integer=True, unit="s")),
    )
    start_timeout: float = Field(
        default=300.0,
        description="a sandbox not running this long after its creation is a runtime_start "
        "error, and is terminated",
        **pydantic_range(TIMEOUT_S),
    )
    create_retries: int = Field(
        default=12,
        description="retries (exponential backoff) of a creation refused for a rate limit or "
        "quota (RESOURCE_EXHAUSTED), each counted as a runtime retry",
        **pydantic_range(Bound(0, 1000, integer=True, unit="retries")),
    )
    network: bool = Field(default=False, description="outbound network (off: block_network)")
    workdir: str = Field(default="/work", pattern="^/", description="the sandbox's workdir")
    env: dict[str, str] = Field(default_factory=dict, description="the sandbox's environment")
    _run_id: str = PrivateAttr(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def run_id(self) -> str:
        """This run's id (one config object per run): its app's name and every sandbox's tag."""
        return self._run_id

    def app_name(self) -> str:
        return f"{self.app}-{self.run_id}"

    def create(self, throttle: Throttle | None = None) -> Runtime:
        return ModalRuntime(self, throttle)

    def check(self) -> None:
        check_modal()

    def image_form(self) -> str | None:
        return "tag"

    def for_task(self, task: TaskSandbox) -> RuntimeConfig:
        """The task's image (its Dockerfile built by the service when the task has a build
        context, else its name from the registry), WORKDIR, ENV, CPUs, memory;
        outbound network exactly when the task allows the internet."""
        update: dict[str, Any] = {}
        if task.context is not None:
            update["dockerfile"] = posixpath.join(task.context, "Dockerfile")
        if task.image is not None:
            update["image"] = task.image
        if task.workdir is not None:
            update["workdir"] = task.workdir
        update["env"] = {**task.env, **self.env}
        if task.cpus is not None:
            update["cpu"] = task.cpus
        if task.memory_mb is not None:
            update["memory_mb"] = task.memory_mb
        update["network"] = task.internet
        copy = self.model_copy(update=update)
        copy._run_id = self.run_id  # the same run: the same app and tags
        return copy

    def cleanup(self, report: CleanupReport, *, everything: bool = False) -> None:
        """Terminate the sandboxes of dead runs of this host; nothing to do without the extra
        or credentials (noted), and a service that does not answer is noted, not raised."""
        try:
            check_modal()
        except UsageError as exc:
            report.notes.append(f"modal: not looked at ({exc})")
            return
        try:
            asyncio.run(clean_modal(report, everything=everything))
        except Exception as exc:  # the service's failure is the report's, not a traceback
            report.notes.append(f"modal: cleanup failed: {brief(exc)}")

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`memory_mb` is the sandbox's own field; other limits are not."""
        limits = [k for k in _LIMIT_KEYS if k in options]
        if limits:
            unknown_options(cls, {k: options[k] for k in limits})
        return super().from_flat(options)

    @classmethod
    def flat_keys(cls) -> list[str]:
        return [k for k in cls.model_fields if k != "type"]


class ModalRuntime(RuntimeBase):
    config: ModalConfig

    def __init__(self, config: ModalConfig, throttle: Throttle | None = None) -> None:
        super().__init__(config, throttle)
        self.box = uuid.uuid4().hex
        self.start_retries = 0
        self._sandbox: Any = None
        self._creating: asyncio.Future[Any] | None = None
        self._app: Any = None

    def tags(self) -> dict[str, str]:
        return {
            TAG: "1",
            RUN_TAG: self.config.run_id,
            PID_TAG: str(os.getpid()),
            HOST_TAG: socket.gethostname(),
            BOX_TAG: self.box,
        }

    async def start(self) -> None:
        await self._await_throttle()
        try:
            import modal
            from modal.exception import ResourceExhaustedError
        except ImportError:
            raise RuntimeStartError(EXTRA) from None
        cfg = self.config
        deadline = time.monotonic() + cfg.start_timeout
        try:
            self._app = await modal.App.lookup.aio(cfg.app_name(), create_if_missing=True)
            image = self._image(modal)
        except (modal.exception.Error, OSError) as exc:
            raise RuntimeStartError(f"modal: {brief(exc)}") from None
        while True:
            self._creating = asyncio.ensure_future(self._create(modal, image))
            left = deadline - time.monotonic()
            try:
                self._sandbox = await asyncio.wait_for(asyncio.shield(self._creating), left)
                self._creating = None
                return
            except TimeoutError:
                raise RuntimeStartError(
                    f"modal sandbox not running within {cfg.start_timeout:g} s"
                ) from None
            except ResourceExhaustedError as exc:
                self._creating = None
                self.start_retries += 1
                wait = backoff_s(self.start_retries, *BACKOFF_S, jitter=0.5)
                if self.start_retries > cfg.create_retries or time.monotonic() + wait > deadline:
                    raise RuntimeStartError(
                        f"modal refused the sandbox {self.start_retries} times: {brief(exc)}"
                    ) from None
                logger.info("modal: %s; retry %d in %.1f s", brief(exc), self.start_retries, wait)
                await asyncio.sleep(wait)
            except (modal.exception.Error, OSError) as exc:
                self._creating = None
                raise RuntimeStartError(f"modal: {brief(exc)}") from None

    async def _create(self, modal: Any, image: Any) -> Any:
        cfg = self.config
        return await modal.Sandbox.create.aio(
            "sleep",
            "infinity",
            app=self._app,
            image=image,
            cpu=cfg.cpu,
            # request and limit: a bare number is only a request on Modal
            memory=(cfg.memory_mb, cfg.memory_mb) if cfg.memory_mb else None,
            timeout=cfg.timeout_s,
            workdir=cfg.workdir,
            block_network=not cfg.network,
            tags=self.tags(),
        )

    def _image(self, modal: Any) -> Any:
        if self.config.dockerfile:
            return modal.Image.from_dockerfile(self.config.dockerfile)
        return modal.Image.from_registry(self.config.image)

    async def stop(self) -> None:
        """Terminate the sandbox; a creation still in flight is awaited and its sandbox (found
        by this runtime's own tag if its id never came back) terminated too. Idempotent."""
        creating, self._creating = self._creating, None
        if creating is not None:
            creating.cancel()
            with contextlib.suppress(BaseException):
                self._sandbox = await asyncio.wait_for(creating, STOP_TIMEOUT_S)
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await terminate(sandbox)
        if creating is not None:
            await self._terminate_tagged()

    async def _terminate_tagged(self) -> None:
        import modal

        try:
            async for sandbox in modal.Sandbox.list.aio(
                app_id=getattr(self._app, "app_id", None), tags={BOX_TAG: self.box}
            ):
                await terminate(sandbox)
        except (modal.exception.Error, OSError) as exc:
            logger.warning("modal: cannot look for sandbox %s to stop it: %s", self.box, exc)

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        import modal

        sandbox = self._live()
        merged = {**self.config.env, **(env or {})}
        started = time.perf_counter()
        out, err = (
            CappedBuffer(self.config.output_cap_bytes),
            CappedBuffer(self.config.output_cap_bytes),
        )
        try:
            process = await sandbox.exec.aio(
                *argv,
                workdir=self._path(cwd) if cwd else self.config.workdir,
                env=merged or None,
                timeout=max(1, math.ceil(timeout)) if timeout else None,
                text=False,
            )
            code = await _collect(process, out, err, timeout + CLIENT_GRACE_S if timeout else None)
        except TimeoutError:
            code = 124
        except (modal.exception.Error, OSError) as exc:
            raise SandboxLostError(f"modal sandbox lost under a command: {brief(exc)}") from None
        duration = time.perf_counter() - started
        timed_out = timeout is not None and duration >= timeout and code != 0
        return ProgramResult(
            exit_code=124 if timed_out else int(code),
            stdout=out.text(),
            stderr=err.text(),
            timed_out=timed_out,
            duration_s=duration,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
        )

    async def read(self, path: str) -> bytes:
        import modal

        try:
            data: bytes = await self._live().filesystem.read_bytes.aio(self._path(path))
            return data
        except modal.exception.SandboxFilesystemNotFoundError as exc:
            raise FileNotFoundError(f"{path}: {exc}") from None
        except modal.exception.SandboxFilesystemError as exc:
            raise OSError(f"{path}: {exc}") from None
        except (modal.exception.Error, OSError) as exc:
            raise SandboxLostError(f"modal sandbox lost reading {path}: {brief(exc)}") from None

    async def write(self, path: str, data: bytes | str) -> None:
        import modal

        payload = data.encode() if isinstance(data, str) else data
        try:
            await self._live().filesystem.write_bytes.aio(payload, self._path(path))
        except modal.exception.SandboxFilesystemError as exc:
            raise OSError(f"cannot write {path}: {exc}") from None
        except (modal.exception.Error, OSError) as exc:
            raise SandboxLostError(f"modal sandbox lost writing {path}: {brief(exc)}") from None

    def _live(self) -> Any:
        if self._sandbox is None:
            raise SandboxLostError("the modal sandbox is not running")
        return self._sandbox

    def _path(self, path: str) -> str:
        """The SDK takes absolute paths; a relative one is under the workdir, as elsewhere."""
        return posixpath.normpath(posixpath.join(self.config.workdir, path))


async def _collect(process: Any, out: CappedBuffer, err: CappedBuffer, bound: float | None) -> int:
    """The exit code, stdout and stderr read meanwhile; within `bound` seconds (TimeoutError).
    The readers and the wait end with the call, whatever ends it (a cancelled run included)."""
    waiter = asyncio.ensure_future(process.wait.aio())
    readers = [
        asyncio.ensure_future(_drain(process.stdout, out)),
        asyncio.ensure_future(_drain(process.stderr, err)),
    ]
    parts = [waiter, *readers]
    try:
        async with asyncio.timeout(bound):
            # the first failure ends the call: a stream the router lost does not wait for an
            # exit status the SDK would poll for ever
            await asyncio.gather(*parts)
        return int(waiter.result())
    finally:
        for part in parts:
            part.cancel()
        await asyncio.gather(*parts, return_exceptions=True)


async def _drain(stream: Any, into: CappedBuffer) -> None:
    async for chunk in stream:
        into.add(chunk if isinstance(chunk, bytes) else chunk.encode())
