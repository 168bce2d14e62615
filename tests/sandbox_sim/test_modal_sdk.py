"""The unmodified `modal` SDK (pinned) against `metrale sandbox-sim modal`: what the modal
runtime calls works over the wire (create, exec with stdout/stderr and wait, files, list by
tag, terminate), with real sandboxes behind, and anything else is a loud UNIMPLEMENTED."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest

from tests.sandbox_sim.modal_sim import ModalSim

modal = pytest.importorskip("modal", reason="the modal extra is not installed")


def _run(body: Any) -> Any:
    return asyncio.run(body())


def test_create_exec_files_list_terminate(modal_sim: ModalSim) -> None:
    tag = {"metrale.test": uuid.uuid4().hex}

    async def body() -> None:
        app = await modal.App.lookup.aio("metrale-test-sdk", create_if_missing=True)
        image = modal.Image.from_registry("python:3.11-slim")
        sb = await modal.Sandbox.create.aio(
            "sleep", "infinity", app=app, image=image, cpu=1.0, memory=512, timeout=600,
            workdir="/work", tags=tag,
        )  # fmt: skip
        try:
            proc = await sb.exec.aio("sh", "-c", "echo out; pwd; echo err >&2; exit 3")
            assert await proc.stdout.read.aio() == "out\n/work\n"
            assert await proc.stderr.read.aio() == "err\n"
            assert await proc.wait.aio() == 3
            env = await sb.exec.aio("sh", "-c", 'echo "$GIVEN"', env={"GIVEN": "yes"})
            assert (await env.stdout.read.aio(), await env.wait.aio()) == ("yes\n", 0)
            blob = bytes(range(256)) * 64
            await sb.filesystem.write_bytes.aio(blob, "/work/deep/blob.bin")
            assert await sb.filesystem.read_bytes.aio("/work/deep/blob.bin") == blob
            seen = await sb.exec.aio("sh", "-c", "wc -c < /work/deep/blob.bin")
            assert (await seen.stdout.read.aio()).strip() == str(len(blob))
            with pytest.raises(modal.exception.SandboxFilesystemNotFoundError):
                await sb.filesystem.read_bytes.aio("/work/none")
            listed = [
                s.object_id async for s in modal.Sandbox.list.aio(app_id=app.app_id, tags=tag)
            ]
            assert listed == [sb.object_id]
            assert modal_sim.live(), "the emulator does not show the sandbox"
        finally:
            await sb.terminate.aio()
        after = [s.object_id async for s in modal.Sandbox.list.aio(app_id=app.app_id, tags=tag)]
        assert after == []

    _run(body)
    assert modal_sim.live() == []


def test_a_call_it_does_not_implement_is_unimplemented_naming_it(modal_sim: ModalSim) -> None:
    async def body() -> None:
        app = await modal.App.lookup.aio("metrale-test-sdk", create_if_missing=True)
        sb = await modal.Sandbox.create.aio(
            "sleep", "infinity", app=app, image=modal.Image.from_registry("debian:bookworm-slim")
        )
        try:
            with pytest.raises(modal.exception.UnimplementedError, match="SandboxTagsSetV2"):
                await sb.set_tags.aio({"a": "b"})
        finally:
            await sb.terminate.aio()

    _run(body)
    assert "SandboxTagsSetV2" in modal_sim.state()["unimplemented"]
    assert modal_sim.live() == []


def test_an_outbound_allowlist_naming_hosts_is_refused_not_approximated(
    modal_sim: ModalSim,
) -> None:
    """The emulator gives a sandbox the host's network or none (`block_network`, or an empty
    allowlist: the conformance suite's network tests); a list naming hosts would be either
    more or less than asked, so the creation fails saying so."""

    async def body() -> None:
        app = await modal.App.lookup.aio("metrale-test-sdk", create_if_missing=True)
        image = modal.Image.from_registry("debian:bookworm-slim")
        with pytest.raises(modal.exception.Error, match="allowlist is not emulated"):
            await modal.Sandbox.create.aio(
                "sleep", "infinity", app=app, image=image, outbound_cidr_allowlist=["10.0.0.0/8"]
            )
        closed = await modal.Sandbox.create.aio(
            "sleep", "infinity", app=app, image=image, outbound_cidr_allowlist=[]
        )
        await closed.terminate.aio()

    _run(body)
    assert modal_sim.live() == []


def test_a_connection_may_hold_more_streams_than_a_thousand_sandboxes(modal_sim: ModalSim) -> None:
    """The SDK sends every control-plane call over one connection, and a creation holds its
    stream while pending: at h2's default of 100 streams the emulator, not the service it
    stands for, bounded a 1,024-rollout run (and terminations queued past their deadline)."""
    import socket
    from urllib.parse import urlparse

    from h2.connection import H2Connection
    from h2.events import RemoteSettingsChanged
    from h2.settings import SettingCodes

    where = urlparse(modal_sim.url)
    conn = H2Connection()
    conn.initiate_connection()
    limit = 0  # the last value the server set (its first SETTINGS frame may say 100)
    with socket.create_connection((where.hostname, where.port), timeout=2) as sock:
        sock.sendall(conn.data_to_send())
        with contextlib.suppress(TimeoutError):
            while limit < 4096:
                data = sock.recv(65536)
                assert data, "the emulator closed the connection"
                for event in conn.receive_data(data):
                    if isinstance(event, RemoteSettingsChanged):
                        changed = event.changed_settings.get(SettingCodes.MAX_CONCURRENT_STREAMS)
                        limit = changed.new_value if changed is not None else limit
                sock.sendall(conn.data_to_send())
    assert limit >= 4096
