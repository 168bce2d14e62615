"""serve's tokenizer finds the endpoint that really counts: llama-server answers a body in
another server's field (`prompt`) with 200 and no tokens, which must not pass for a count."""

from __future__ import annotations

import asyncio

from aiohttp import web

from metrale.benchmarks.serve.prompts import Tokenizer
from metrale.endpoint.client import Target
from metrale.endpoint.http import ConnectionPool


async def _llama_server_tokenize(request: web.Request) -> web.Response:
    """llama-server's /tokenize: `content` is tokenized (one token a word, BOS first), any
    other field is ignored and the answer is an empty token list."""
    body = await request.json()
    text = body.get("content")
    tokens = [] if text is None else [1] + [7] * len(text.split())
    return web.json_response({"tokens": tokens})


def test_a_field_the_server_ignores_is_not_taken_for_a_count() -> None:
    async def go() -> tuple[bool, int]:
        app = web.Application()
        app.router.add_post("/tokenize", _llama_server_tokenize)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}/v1")
        try:
            tokenizer = Tokenizer(pool, Target(base_url=f"http://127.0.0.1:{port}/v1", model="m"))
            found = await tokenizer.detect()
            return found, await tokenizer.count("three short words")
        finally:
            await pool.close()
            await runner.cleanup()

    found, count = asyncio.run(go())
    assert found and count == 3  # BOS, counted in "", is subtracted
