"""The emulator's control plane without a sandbox: every creation here is stuck pending, so
no real sandbox starts. What it does not implement is loud (501, the route named, logged)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from metrale.sandbox_sim.backend import Backend
from metrale.sandbox_sim.faults import FaultConfig, Faults
from metrale.sandbox_sim.prime import API, PrimeEmulator

KEY = {"Authorization": "Bearer sim-prime-key"}


async def _with_emulator(
    faults: FaultConfig, body: Callable[[aiohttp.ClientSession, str, PrimeEmulator], Awaitable[Any]]
) -> Any:
    emulator = PrimeEmulator(Backend("bwrap"), Faults(faults))
    url = await emulator.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            return await body(session, url, emulator)
    finally:
        await emulator.stop()
        await emulator.backend.close()


def run(faults: FaultConfig, body: Callable[..., Awaitable[Any]]) -> Any:
    return asyncio.run(_with_emulator(faults, body))


async def _create(session: aiohttp.ClientSession, url: str, **extra: Any) -> aiohttp.ClientResponse:
    body = {"name": "t", "docker_image": "python:3.11-slim", "labels": ["run=a"], **extra}
    return await session.post(f"{url}{API}/sandbox", json=body, headers=KEY)


def test_an_unimplemented_route_is_501_naming_it_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body(session: aiohttp.ClientSession, url: str, _: PrimeEmulator) -> None:
        unknown = [
            ("GET", f"{API}/sandbox/x/logs"),
            ("PATCH", f"{API}/sandbox/x"),
            ("POST", "/gateway/sim/x/command_session.CommandSession/List"),
        ]
        for method, path in unknown:
            async with session.request(method, f"{url}{path}", headers=KEY) as response:
                assert response.status == 501
                assert f"{method} {path}" in (await response.json())["detail"]
        async with session.get(f"{url}{API}/sandbox/nope", headers=KEY) as response:
            assert response.status == 404  # a known route's own answer stays

    with caplog.at_level(logging.ERROR, logger="metrale.sandbox_sim"):
        run(FaultConfig(), body)
    assert "not implemented by the emulator: GET /api/v1/sandbox/x/logs" in caplog.text


def test_a_wrong_key_is_401() -> None:
    async def body(session: aiohttp.ClientSession, url: str, _: PrimeEmulator) -> None:
        bad = {"Authorization": "Bearer wrong"}
        async with session.get(f"{url}{API}/sandbox", headers=bad) as response:
            assert response.status == 401

    run(FaultConfig(), body)


def test_over_the_creation_rate_is_429_and_counted() -> None:
    async def body(session: aiohttp.ClientSession, url: str, em: PrimeEmulator) -> list[int]:
        statuses = [(await _create(session, url)).status for _ in range(5)]
        async with session.get(f"{url}/_state") as response:
            state = await response.json()
        assert state["refused"] == 3 and len(state["sandboxes"]) == 2
        return statuses

    assert run(FaultConfig(create_rate=2, stuck=1.0), body) == [200, 200, 429, 429, 429]


def test_the_quota_refuses_until_a_sandbox_is_deleted() -> None:
    async def body(session: aiohttp.ClientSession, url: str, em: PrimeEmulator) -> None:
        first = await (await _create(session, url)).json()
        assert (await _create(session, url)).status == 200
        assert (await _create(session, url)).status == 429
        await session.delete(f"{url}{API}/sandbox/{first['id']}", headers=KEY)
        assert (await _create(session, url)).status == 200

    run(FaultConfig(quota=2, stuck=1.0), body)


def test_stuck_creations_stay_pending_and_bulk_delete_by_label_removes_them() -> None:
    async def body(session: aiohttp.ClientSession, url: str, em: PrimeEmulator) -> None:
        ids = [(await (await _create(session, url)).json())["id"] for _ in range(3)]
        other = await (await _create(session, url, labels=["run=b"])).json()
        await asyncio.sleep(0.2)
        status = await session.post(
            f"{url}{API}/sandbox/status:batchGet", json={"sandbox_ids": [*ids, "gone"]},
            headers=KEY,
        )  # fmt: skip
        answer = await status.json()
        assert {s["status"] for s in answer["statuses"]} == {"PENDING"}
        assert answer["errors"] == [
            {"sandbox_id": "gone", "code": "NOT_FOUND", "message": "sandbox not found"}
        ]
        deleted = await session.delete(
            f"{url}{API}/sandbox", json={"labels": ["run=a"]}, headers=KEY
        )
        assert sorted((await deleted.json())["succeeded"]) == sorted(ids)
        assert list(em.sandboxes) == [other["id"]]

    run(FaultConfig(stuck=1.0), body)


def test_the_same_idempotency_key_is_one_sandbox() -> None:
    async def body(session: aiohttp.ClientSession, url: str, em: PrimeEmulator) -> None:
        a = await (await _create(session, url, idempotency_key="k1")).json()
        b = await (await _create(session, url, idempotency_key="k1")).json()
        assert a["id"] == b["id"] and len(em.sandboxes) == 1

    run(FaultConfig(stuck=1.0), body)


def test_a_status_batch_over_100_ids_is_refused() -> None:
    async def body(session: aiohttp.ClientSession, url: str, _: PrimeEmulator) -> int:
        response = await session.post(
            f"{url}{API}/sandbox/status:batchGet",
            json={"sandbox_ids": [f"s{i}" for i in range(101)]}, headers=KEY,
        )  # fmt: skip
        return response.status

    assert run(FaultConfig(), body) == 422
