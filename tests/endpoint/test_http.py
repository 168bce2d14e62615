"""The lean HTTP/1.1 client against hand-written servers: every framing, reuse, stale sockets."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from metrale.endpoint.http import ConnectionPool, HttpConnectionError, HttpProtocolError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


async def serve(handler: Handler, *, ssl_ctx: ssl.SSLContext | None = None):
    connections = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=ssl_ctx)
    return server, server.sockets[0].getsockname()[1], connections


@contextlib.asynccontextmanager
async def pool_for(handler: Handler, prefix: str = "", **kw):
    """A server running `handler` and a pool to it; both closed on the way out."""
    server, port, conns = await serve(handler)
    pool = ConnectionPool(f"http://127.0.0.1:{port}{prefix}", **kw)
    try:
        yield pool, conns
    finally:
        await pool.close()
        server.close()


def run(coro):
    return asyncio.run(coro)


def test_content_length_body_and_keep_alive_reuse() -> None:
    async def handler(reader, writer):
        while True:
            head, body = await read_request(reader)
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"Authorization: Bearer k" in head
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def go():
        async with pool_for(handler, "/v1", headers={"Authorization": "Bearer k"}) as (pool, conns):
            for i in range(3):
                resp = await pool.post("/chat/completions", b"hello %d" % i)
                assert resp.status == 200 and await resp.read() == b"hello %d" % i
                resp.release()
            assert len(conns) == 1  # one connection, kept alive and reused

    run(go())


def test_chunked_body_arrives_in_pieces_without_framing() -> None:
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: text/event-stream; charset=utf-8\r\n\r\n")  # fmt: skip
        for piece in (b"data: 1\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def go():
        async with pool_for(handler) as (pool, _):
            resp = await pool.post("/x", b"{}")
            assert resp.content_type == "text/event-stream"
            pieces = [p async for p in resp.iter_chunks()]
            assert pieces == [b"data: 1\n\n", b"data: [DONE]\n\n"]
            resp.release()
            assert len(pool._idle) == 1

    run(go())


def test_a_body_read_in_two_goes_continues_where_it_stopped() -> None:
    """The stream parser stops at [DONE] and drains the rest later: one body iterator. (A
    piece is what one arrival carries: the first chunk is sent on its own.)"""

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"first", b"second", b"third"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            if piece == b"first":
                await writer.drain()
                await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def go():
        async with pool_for(handler) as (pool, _):
            resp = await pool.post("/x", b"")
            async for piece in resp.iter_chunks():
                assert piece == b"first"
                break
            rest = [p async for p in resp.iter_chunks()]
            assert b"".join(rest) == b"secondthird"
            resp.release()
            assert len(pool._idle) == 1  # read whole, in two goes: reusable

    run(go())


def test_a_path_from_the_origin_root_skips_the_base_path() -> None:
    seen: list[bytes] = []

    async def handler(reader, writer):
        while True:
            head, _ = await read_request(reader)
            seen.append(head.split(b"\r\n", 1)[0])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async def go():
        async with pool_for(handler, "/openai/v1") as (pool, conns):
            for path, under in (("/chat/completions", True), ("/tokenize", False)):
                resp = await pool.post(path, b"{}", under_base=under)
                assert await resp.read() == b"{}"
                resp.release()
            assert len(conns) == 1

    run(go())
    assert seen == [b"POST /openai/v1/chat/completions HTTP/1.1", b"POST /tokenize HTTP/1.1"]


def test_a_get_sends_no_body_and_shares_the_connections() -> None:
    heads: list[bytes] = []

    async def handler(reader, writer):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{"a"')
            await writer.drain()

    async def go():
        async with pool_for(handler, "/v1") as (pool, conns):
            for _ in range(2):
                resp = await pool.get("/models")
                assert resp.status == 200 and await resp.read() == b'{"a"'
                resp.release()
            assert len(conns) == 1

    run(go())
    assert heads[0].startswith(b"GET /v1/models HTTP/1.1\r\n")
    assert b"content-length" not in heads[0].lower()


def test_body_until_close_is_not_reused() -> None:
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it")
        await writer.drain()

    async def go():
        async with pool_for(handler) as (pool, _):
            resp = await pool.post("/x", b"")
            assert await resp.read() == b"all of it"
            resp.release()
            assert pool._idle == []

    run(go())


def test_a_stale_keep_alive_connection_is_replaced() -> None:
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # ...then the server drops the idle connection, as servers do after a keep-alive timeout.

    async def go():
        async with pool_for(handler) as (pool, conns):
            for _ in range(2):
                resp = await pool.post("/x", b"")
                assert await resp.read() == b"ok"
                resp.release()
                await asyncio.sleep(0.05)
            assert len(conns) == 2

    run(go())


def test_a_connection_cut_mid_body_is_a_connection_error() -> None:
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()

    async def go():
        async with pool_for(handler) as (pool, _):
            resp = await pool.post("/x", b"")
            with pytest.raises(HttpConnectionError, match="closed mid-body"):
                await resp.read()
            resp.release()
            assert pool._idle == []

    run(go())


def test_refused_and_garbage_responses() -> None:
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n")
        await writer.drain()

    async def go():
        server, port, _ = await serve(handler)
        try:
            with pytest.raises(HttpProtocolError, match="not an HTTP status line") as info:
                await ConnectionPool(f"http://127.0.0.1:{port}").post("/x", b"")
            assert info.value.kind == "bad_status_line"
        finally:
            server.close()
        with pytest.raises(HttpConnectionError, match="cannot connect"):
            await ConnectionPool(f"http://127.0.0.1:{port}").post("/x", b"")

    run(go())


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
                    reason="openssl is not installed")  # fmt: skip
def test_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
        await writer.drain()

    async def go():
        server, port, _ = await serve(handler, ssl_ctx=server_ctx)
        pool = ConnectionPool(f"https://localhost:{port}/v1")
        try:
            resp = await pool.post("/x", b"")
            assert await resp.read() == b"secret"
            resp.release()
        finally:
            await pool.close()
            server.close()

    run(go())


def test_fired_requests_are_written_at_once_and_answered_on_complete() -> None:
    """`fire` writes on idle open connections, in order, before any answer is awaited; with no
    idle one, `complete` connects; a stale one is replaced as `request` replaces it."""
    served: list[bytes] = []

    async def handler(reader, writer):
        while True:
            _, body = await read_request(reader)
            served.append(body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def go():
        async with pool_for(handler, "/v1") as (pool, conns):
            assert await pool.open(2) == 2
            outs = [pool.outgoing("/chat/completions", b"r%d" % i) for i in range(3)]
            for out in outs:
                pool.fire(out)
            assert [out.conn is not None for out in outs] == [True, True, False]
            assert all(out.handed_at > 0 for out in outs)
            for i, out in enumerate(outs):
                resp = await pool.complete(out)
                assert await resp.read() == b"r%d" % i
                resp.release()
            assert sorted(served) == [b"r0", b"r1", b"r2"] and len(conns) == 2  # r2: r0's, reused
            for writer in conns:  # the server drops every idle connection
                writer.close()
            await asyncio.sleep(0.05)
            again = pool.outgoing("/chat/completions", b"again")
            pool.fire(again)
            resp = await pool.complete(again)
            assert await resp.read() == b"again"
            resp.release()

    run(go())
