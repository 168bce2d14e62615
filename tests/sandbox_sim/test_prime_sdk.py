"""The contract with the service: the official `prime-sandboxes` SDK, unmodified, against
`metrale sandbox-sim prime`, for every call metrale's prime runtime makes (and the cleanup's
sync client). A call the emulator does not implement fails loudly with its route named, so an
SDK upgrade that calls something new fails here."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.prime_emulator import client_env, prime_emulator

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")
prime = pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")


async def _drive() -> None:
    client = prime.AsyncSandboxClient()
    try:
        request = prime.CreateSandboxRequest(
            name="contract", docker_image="python:3.11-slim", labels=["contract", "run-a"],
            environment_vars={"FROM_CREATE": "yes"}, memory_gb=0.5,
        )  # fmt: skip
        made = await client.create(request)
        assert made.status == "PENDING" and made.labels == ["contract", "run-a"]
        await client.wait_for_creation(made.id)  # the SDK's own polls and reachability probe
        statuses = await client.get_sandbox_statuses([made.id])
        assert [s.status for s in statuses.statuses] == ["RUNNING"]

        answer = await client.execute_command(
            made.id, 'echo "$FROM_CREATE $X"; pwd; echo oops >&2; exit 7',
            working_dir="/tmp", env={"X": "x"},
        )  # fmt: skip
        assert (answer.stdout, answer.stderr, answer.exit_code) == ("yes x\n/tmp\n", "oops\n", 7)
        with pytest.raises(prime.CommandTimeoutError):
            await client.execute_command(made.id, "sleep 30", timeout=1)

        blob = bytes(range(256)) * 64
        await client.upload_bytes(made.id, "/work/d/blob.bin", blob, "blob.bin")
        with tempfile.TemporaryDirectory() as tmp:
            await client.download_file(made.id, "/work/d/blob.bin", os.path.join(tmp, "b"))
            got = await asyncio.to_thread(Path(tmp, "b").read_bytes)
            assert got == blob

        with pytest.raises(prime.APIError, match="501.*GET /api/v1/sandbox/.*/logs"):
            await client.get_logs(made.id)  # not implemented: loud, with the route

        listed = await client.list(labels=["contract"])
        assert [s.id for s in listed.sandboxes] == [made.id]
        assert (await client.get(made.id)).status == "RUNNING"
        other = await client.create(request.model_copy(update={"labels": ["contract", "run-b"]}))
        gone = await client.bulk_delete(labels=["run-a"])
        assert gone.succeeded == [made.id]
        await client.delete(other.id)
        assert (await client.list(labels=["contract"])).sandboxes == []
    finally:
        await client.aclose()


def test_the_async_client_drives_every_call_the_runtime_makes() -> None:
    with prime_emulator() as emulator, client_env(emulator):
        asyncio.run(_drive())
        assert emulator.left() == []


def test_the_sync_client_lists_and_bulk_deletes_as_the_cleanup_does() -> None:
    with prime_emulator("--stuck", "1") as emulator, client_env(emulator):
        client = prime.SandboxClient(prime.APIClient())
        request = prime.CreateSandboxRequest(name="s", docker_image="img", labels=["metrale"])
        ids = [client.create(request.model_copy(update={"name": f"s{i}"})).id for i in range(3)]
        page = client.list(labels=["metrale"], page=1, per_page=2)
        assert (page.total, len(page.sandboxes), page.has_next) == (3, 2, True)
        assert sorted(client.bulk_delete(sandbox_ids=ids).succeeded) == sorted(ids)
        assert emulator.left() == []


def test_egress_rules_are_kept_exactly_or_refused() -> None:
    """The SDK's documented "deny all egress" (`network_allowlist=[]`) and a denylist of the
    whole IPv4 space are kept (and shown back); a list naming hosts is refused with a 422 that
    says what is accepted, since the emulator gives a sandbox all of the host's network or
    none. Whether a sandbox then reaches anything is the conformance suite's
    (`test_network_is_off_by_default[prime]`, `test_network_when_asked_reaches_the_host`)."""

    async def drive() -> None:
        client = prime.AsyncSandboxClient()
        try:
            base = prime.CreateSandboxRequest(name="net", docker_image="img", labels=["net"])
            closed = await client.create(base.model_copy(update={"network_allowlist": []}))
            denied = await client.create(
                base.model_copy(update={"network_denylist": ["0.0.0.0/0"]})
            )
            assert closed.network_allowlist == [] and denied.network_denylist == ["0.0.0.0/0"]
            with pytest.raises(prime.APIError, match="422.*not emulated.*network_allowlist=\\[\\]"):
                await client.create(base.model_copy(update={"network_allowlist": ["pypi.org"]}))
            await client.bulk_delete(labels=["net"])
        finally:
            await client.aclose()

    with prime_emulator("--stuck", "1") as emulator, client_env(emulator):
        asyncio.run(drive())
        assert emulator.left() == []
