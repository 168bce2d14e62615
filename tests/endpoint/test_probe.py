"""Every way a target can be wrong is one line; a right one yields its models."""

import asyncio

import pytest
from aiohttp import web

from metrale.endpoint.client import Target
from metrale.endpoint.probe import preflight, probe
from metrale.errors import UsageError
from metrale.net import free_port


def test_probe_finds_the_served_model(sim) -> None:
    found = asyncio.run(probe(sim.url.removesuffix("/v1")))
    assert found.model == "metrale-sim"
    assert found.base_url == sim.url


def test_unknown_model_lists_the_served_ones(sim) -> None:
    with pytest.raises(UsageError, match="model 'gpt-9' is not served .* it serves: metrale-sim"):
        asyncio.run(probe(sim.url, "gpt-9"))


def test_connection_refused() -> None:
    port = free_port()
    with pytest.raises(UsageError, match="connection refused"):
        asyncio.run(probe(f"http://127.0.0.1:{port}"))


def test_dns_failure() -> None:
    with pytest.raises(UsageError, match="cannot resolve host 'no-such-host.invalid'"):
        asyncio.run(probe("http://no-such-host.invalid:8000"))


def test_not_a_url() -> None:
    with pytest.raises(UsageError, match="is not an http"):
        asyncio.run(probe("ftp://x"))


@pytest.mark.parametrize(
    ("status", "body"), [(200, "<html>hello</html>"), (404, "not found"), (200, '{"x": 1}')]
)
def test_a_server_that_is_not_openai_compatible(status: int, body: str) -> None:
    async def go() -> None:
        app = web.Application()

        async def models(request: web.Request) -> web.Response:
            return web.Response(status=status, text=body)

        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await probe(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    with pytest.raises(UsageError, match="is not an OpenAI-compatible server"):
        asyncio.run(go())


def test_preflight_records_whether_the_model_said_4(sim_factory) -> None:
    good = sim_factory("--reply", "4")
    bad = sim_factory("--reply", "It is 44 or 5")
    assert asyncio.run(preflight(Target(base_url=good.url, model="metrale-sim"))).ok
    check = asyncio.run(preflight(Target(base_url=bad.url, model="metrale-sim")))
    assert not check.ok and check.answer == "It is 44 or 5"
