"""The ray runtime's cluster side: the actor that holds a sandbox on whichever node Ray placed
it, and joining (or starting) the cluster. `metrale.runtime.ray` imports it on first start.

This is how a run outgrows one machine without a home-made scheduler: Ray decides placement
(SPREAD by default), metrale only creates one actor per sandbox and kills it in `stop()`, so no
actor outlives its rollout. Workers must be able to import metrale (same environment).
Importing this module imports `ray` (the `ray` extra); `create_runtime` does so only on demand.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import ray

from metrale.runtime.base import Runtime

logger = logging.getLogger(__name__)

NAMESPACE = "metrale"


@ray.remote
class SandboxActor:
    """Holds one inner runtime on whichever node Ray placed this actor."""

    def __init__(self, inner: dict[str, Any], make: Callable[[dict[str, Any]], Runtime]) -> None:
        self.runtime = make(inner)

    async def start(self) -> str:
        await self.runtime.start()
        return ray.get_runtime_context().get_node_id()

    async def run(
        self,
        command: str | list[str],
        env: dict[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> dict[str, Any]:
        result = await self.runtime.run(command, env=env, cwd=cwd, timeout=timeout)
        return result.model_dump()

    async def read(self, path: str) -> bytes:
        return await self.runtime.read(path)

    async def write(self, path: str, data: bytes) -> None:
        await self.runtime.write(path, data)

    async def kill_commands(self) -> None:
        await self.runtime.kill_commands()

    async def stop(self) -> None:
        try:
            await self.runtime.stop()
        finally:
            # This process holds this one sandbox and is killed next (ray.kill: no atexit runs),
            # so the /etc copy a bwrap sandbox made in it goes now, not at an exit that never
            # comes (seen: 2 of 3 copies left in /tmp after a normal run).
            from metrale.runtime.bwrap_etc import remove_etc_view

            remove_etc_view()


def connect(address: str) -> None:
    """Join the cluster once per process (`auto`, `ray://...`, `HOST:PORT`, or `local` to start
    a private one); Ray's own connection is process-wide."""
    if ray.is_initialized():
        return
    if address == "local":
        _start_private_cluster()
        return
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, ignore_reinit_error=True)


#: Ray's token-auth settings (Ray >= 2.5x). Left unset, a new local cluster enables token auth
#: and saves a token to ~/.ray/auth_token, which outlives the run: every later `ray start`
#: on the machine then picks it up and clusters refuse each other (InvalidAuthToken).
_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _start_private_cluster() -> None:
    """`--ray-address local`: a cluster of this process only, whose every file (sessions,
    sockets, logs) lives in a temporary directory removed at exit, authenticated by a token
    that lives only in this process's environment (inherited by its Ray workers), never on
    disk. A user's own RAY_AUTH_* settings are respected."""
    # Ray's socket paths (temp/session_<stamp>/sockets/plasma_store) must fit AF_UNIX's 107
    # bytes: a long TMPDIR gives way to /tmp.
    base = tempfile.gettempdir()
    temp = tempfile.mkdtemp(prefix="metrale-ray-", dir=base if len(base) <= 32 else "/tmp")
    saved = {name: os.environ.get(name) for name in _AUTH_ENV}
    if all(v is None for v in saved.values()):
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        _reload_ray_auth()
    try:
        ray.init(
            address="local",
            namespace=NAMESPACE,
            log_to_driver=False,
            include_dashboard=False,
            _temp_dir=temp,
        )
    except BaseException:
        _stop_private_cluster(temp, saved)
        raise
    atexit.register(_stop_private_cluster, temp, saved)


def _reload_ray_auth() -> None:
    """Ray reads its auth settings once, at import: make this process see the new ones (what
    Ray itself does when it turns token auth on). A Ray without token auth has neither."""
    with contextlib.suppress(ImportError, AttributeError):
        raylet: Any = importlib.import_module("ray._raylet")  # private: it moves between Rays
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def _stop_private_cluster(temp: str, saved: dict[str, str | None]) -> None:
    try:
        ray.shutdown()
    except Exception as exc:  # the cluster is going anyway: its processes and temp dir below
        logger.warning("ray.shutdown() of the private cluster failed: %r", exc)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _reload_ray_auth()
    shutil.rmtree(temp, ignore_errors=True)


def kill(actor: Any) -> None:
    """Kill `actor` for good (no restart): its sandbox's processes go with it."""
    ray.kill(actor, no_restart=True)
