"""What the modal runtime needs of the service apart from one sandbox: the check before any
work (the extra, the credentials, the address, each named), the tags every sandbox carries,
terminating a sandbox, and the cleanup of dead runs' sandboxes by tag (`metrale cleanup`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from metrale.errors import UsageError
from metrale.runtime.base import CleanupReport

logger = logging.getLogger(__name__)

TAG = "metrale.sandbox"
RUN_TAG = f"{TAG}.run"
PID_TAG = f"{TAG}.pid"
HOST_TAG = f"{TAG}.host"
BOX_TAG = f"{TAG}.box"
#: How long one attempt to terminate a sandbox may take, and how many are made before it is
#: left to `metrale cleanup` (and to the service's own `timeout_s`).
STOP_TIMEOUT_S = 60.0
STOP_ATTEMPTS = 3
EXTRA = "the modal runtime needs the modal extra: pip install 'metrale[modal]'"


def brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


async def terminate(sandbox: Any) -> None:
    """Terminate and let go of a sandbox; one already gone is not an error."""
    import modal

    for attempt in range(1, STOP_ATTEMPTS + 1):
        try:
            await asyncio.wait_for(sandbox.terminate.aio(), STOP_TIMEOUT_S)
            break
        except modal.exception.NotFoundError:
            break  # gone already
        except (modal.exception.Error, OSError, TimeoutError) as exc:
            level = logging.WARNING if attempt == STOP_ATTEMPTS else logging.INFO
            logger.log(level, "modal: terminating %s failed (attempt %d): %s",
                       sandbox.object_id, attempt, brief(exc))  # fmt: skip
    with contextlib.suppress(Exception):
        await sandbox.detach.aio()


def check_modal() -> None:
    """The extra, the credentials and the service, each named, before any work."""
    try:
        from modal.config import config as sdk_config
    except ImportError:
        raise UsageError(EXTRA) from None
    if not (sdk_config.get("token_id") and sdk_config.get("token_secret")):
        raise UsageError(
            "modal runtime: no credentials; set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET "
            "(or run 'modal token new')"
        )
    url = str(sdk_config.get("server_url"))
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=5).close()
    except OSError as exc:
        raise UsageError(
            f"modal runtime: nothing answers at {url} (MODAL_SERVER_URL): {exc}"
        ) from None


async def clean_modal(report: CleanupReport, *, everything: bool) -> None:
    """Terminate the sandboxes of dead runs of this host (with `everything`: all of them)."""
    import modal

    host = socket.gethostname()
    tags = {TAG: "1"} if everything else {TAG: "1", HOST_TAG: host}
    with _quiet_deprecation():
        found = [sb async for sb in modal.Sandbox.list.aio(tags=tags)]
    for sandbox in found:
        owner = await sandbox.get_tags.aio()
        pid = owner.get(PID_TAG, "")
        alive = owner.get(HOST_TAG) == host and _metrale_alive(pid)
        if alive and not everything:
            report.kept.append(f"modal sandbox {sandbox.object_id} (run of live pid {pid})")
            continue
        await terminate(sandbox)
        report.removed.append(f"modal sandbox {sandbox.object_id}")


def _metrale_alive(pid: str) -> bool:
    try:
        return pid.isdigit() and b"metrale" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


@contextlib.contextmanager
def _quiet_deprecation() -> Any:
    """Listing by tag without an app id warns of a future change; the cleanup of dead runs
    cannot know their apps' ids, and the warning is not the user's to act on."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
