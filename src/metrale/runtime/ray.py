"""The ray runtime: each rollout's sandbox (any installed local runtime: subprocess, bwrap, ...)
lives in a Ray actor that Ray places on some node of the cluster; `run/read/write` are calls to
that actor.

This is how a run outgrows one machine without a home-made scheduler: Ray decides placement
(SPREAD by default), metrale only creates one actor per sandbox and kills it in `stop()`, so no
actor outlives its rollout. Workers must be able to import metrale (same environment). The
cluster side (the actor, joining the cluster) is `ray_cluster`, which imports `ray` (the `ray`
extra): this module does not, so the config is read without it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, field_validator

from metrale.bounds import Bound, pydantic_range
from metrale.errors import UsageError
from metrale.runtime.base import (
    Capability,
    ProgramResult,
    Runtime,
    RuntimeBase,
    RuntimeConfig,
    RuntimeStartError,
    TaskSandbox,
    Throttle,
    unknown_options,
)
from metrale.runtime.configs import parse_runtime_config, runtime_config

logger = logging.getLogger(__name__)


def _inner_config(config: RuntimeConfig) -> RuntimeConfig:
    if config.type == "ray" or Capability.REMOTE in config.capabilities:
        raise UsageError(
            f"the ray runtime cannot hold a {config.type} sandbox; accepted: a local runtime "
            "(subprocess, bwrap, ...)"
        )
    return config


class RayRuntime(RuntimeBase):
    config: RayConfig

    def __init__(
        self,
        config: RayConfig,
        throttle: Throttle | None = None,
        *,
        make_inner: Callable[[dict[str, Any]], Runtime],
    ) -> None:
        """`make_inner` builds the inner runtime from its config's dict, on the actor's node
        (Ray sends the function by reference: `configs.runtime_from_dict`)."""
        super().__init__(config, throttle)
        self._make_inner = make_inner
        self.actor: Any = None
        #: the Ray node the sandbox was placed on, once started
        self.node_id: str | None = None
        self._stopped = False

    async def start(self) -> None:
        from metrale.runtime import ray_cluster

        await self._await_throttle()
        if self._stopped:
            raise RuntimeStartError("runtime already stopped")
        try:
            ray_cluster.connect(self.config.address)
        except Exception as exc:  # ray raises ConnectionError, RuntimeError, ...
            raise RuntimeStartError(f"cannot reach ray at {self.config.address}: {exc}") from exc
        options: dict[str, Any] = {"num_cpus": self.config.actor_cpus}
        if self.config.spread:
            options["scheduling_strategy"] = "SPREAD"
        # `@ray.remote` adds `.options` at run time; Ray's annotations keep the bare class
        actor_class: Any = ray_cluster.SandboxActor
        self.actor = actor_class.options(**options).remote(
            self.config.inner.model_dump(), self._make_inner
        )
        try:
            self.node_id = await self.actor.start.remote()
        except BaseException as exc:
            # failed or cancelled: the actor holds its CPUs until it is killed, whether or not
            # the caller goes on to stop() (a cancelled start is often never stopped)
            await self.stop()
            if isinstance(exc, Exception):
                raise RuntimeStartError(f"ray sandbox did not start: {exc}") from exc
            raise

    def _require(self) -> Any:
        if self.actor is None or self._stopped:
            raise RuntimeError("ray runtime is not started")
        return self.actor

    async def execute(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> ProgramResult:
        raw = await self._require().run.remote(argv, dict(env or {}) or None, cwd, timeout)
        return ProgramResult.model_validate(raw)

    async def read(self, path: str) -> bytes:
        data: bytes = await self._require().read.remote(path)
        return data

    async def write(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        await self._require().write.remote(path, payload)

    async def kill_commands(self) -> None:
        await self._require().kill_commands.remote()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.actor is None:
            return
        from metrale.runtime import ray_cluster

        try:
            # the actor may be dead already; killing it below still holds
            try:
                await asyncio.wait_for(self.actor.stop.remote(), 60)
            except Exception as exc:  # its inner sandbox may be left on that node
                logger.warning("ray actor on node %s: stop failed: %r", self.node_id, exc)
        finally:
            ray_cluster.kill(self.actor)
            self.actor = None


class RayConfig(RuntimeConfig):
    """Each sandbox (`inner`) lives in a Ray actor on some cluster node."""

    type: Literal["ray"] = "ray"
    address: str = Field(default="auto", description="the cluster: auto, HOST:PORT or local")
    inner: SerializeAsAny[RuntimeConfig] = Field(
        default_factory=lambda: runtime_config("subprocess"),
        description="the sandbox each actor holds: an installed local runtime (not ray, not "
        "a remote one)",
    )
    actor_cpus: float = Field(
        default=0.01,
        description="CPU the actor reserves when placed",
        **pydantic_range(Bound(0, 4096, unit="CPUs")),
    )
    spread: bool = Field(default=True, description="SPREAD scheduling across nodes")

    def create(self, throttle: Throttle | None = None) -> Runtime:
        from metrale.runtime.configs import runtime_from_dict

        return RayRuntime(self, throttle, make_inner=runtime_from_dict)

    def check(self) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError(
                "the ray runtime needs the ray extra: pip install 'metrale[ray]'"
            ) from None
        _check_ray_address(self.address)
        self.inner.check()

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`inner="bwrap"` picks the sandbox; every option the ray config does not have goes
        to it (the inner sandbox is also what caps a command's output)."""
        own = {k: options.pop(k) for k in list(options) if k in cls.model_fields}
        if "output_cap_bytes" in own:
            options["output_cap_bytes"] = own["output_cap_bytes"]
        inner = own.pop("inner", "subprocess")
        if isinstance(inner, str):
            own["inner"] = _inner_config(runtime_config(inner, **options))
        else:
            if options:
                unknown_options(cls, options)
            own["inner"] = inner
        return own

    @field_validator("inner", mode="before")
    @classmethod
    def _inner(cls, value: Any) -> RuntimeConfig:
        """An inner config read back from JSON (run.json, the actor's copy) by its `type`."""
        if isinstance(value, RuntimeConfig):
            return _inner_config(value)
        if isinstance(value, Mapping):
            return _inner_config(parse_runtime_config(value))
        raise ValueError("inner must be a runtime config")

    def lacks(self, needs: frozenset[Capability]) -> frozenset[Capability]:
        """What its inner sandbox provides on the actor's node; the driver host's paths and
        the leftovers of other nodes are out of its reach."""
        return needs - (self.inner.capabilities - {Capability.HOST_PATHS, Capability.LEFTOVERS})

    def image_form(self) -> str | None:
        return self.inner.image_form()

    def for_task(self, task: TaskSandbox) -> RuntimeConfig:
        return self.model_copy(update={"inner": self.inner.for_task(task)})


def _check_ray_address(address: str) -> None:
    """A cluster that is not there is a usage error now, before any rollout: `ray.init` would
    retry a HOST:PORT for minutes, and with `auto` every rollout would fail to start. `auto`
    is resolved as Ray does (RAY_ADDRESS, then the last `ray start` on this machine, then a
    running GCS process); `local` starts a private cluster and needs nothing."""
    if address == "auto":
        address = _resolve_ray_auto()
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # local, ray://...: ray itself fails fast or starts one
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise UsageError(f"ray runtime: nothing answers at {address} ({exc})") from None


def _resolve_ray_auto() -> str:
    try:
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address("auto")
    except Exception as exc:  # ConnectionError when none; ray's private API may also move
        if not isinstance(exc, ConnectionError):
            logger.debug("cannot look for a running ray cluster here (%r): ray.init decides", exc)
            return "auto"  # cannot tell here: let ray.init decide
        found = None
    if not found:
        raise UsageError(
            "ray runtime: --ray-address auto found no running Ray cluster; accepted: start one "
            "('ray start --head'), give HOST:PORT, or --ray-address local for a private one"
        )
    return str(found)
