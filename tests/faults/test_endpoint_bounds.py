"""Issue 12 item 9: a hostile or broken server costs bounded memory and is recorded with a
clear error type. Each server is a few lines of raw asyncio on 127.0.0.1."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable

import pytest

from metrale.endpoint.client import ChatClient, ClientOptions, EndpointError, Target

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    sizes = [x.split(b":")[1] for x in head.split(b"\r\n") if x.lower().startswith(b"content-len")]
    length = int(sizes[0]) if sizes else 0
    await reader.readexactly(length)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _call(handler: Handler, **options: object) -> EndpointError:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _read_request(reader)
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        target = Target(base_url=f"http://127.0.0.1:{port}/v1", model="m")
        opts = ClientOptions(retries=0, request_timeout_s=60, **options)  # type: ignore[arg-type]
        async with ChatClient(target, opts) as client:
            with pytest.raises(EndpointError) as info:
                await client.chat([{"role": "user", "content": "hi"}], max_tokens=64)
        return info.value
    finally:
        server.close()
        await server.wait_closed()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD)
    event = _chunk(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' * 200)
    for _ in range(200_000):  # bounded: 2 GB if nobody stopped reading
        writer.write(event)
        await writer.drain()


async def _one_huge_event(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + _chunk(b'data: {"choices":[{"delta":{"content":"'))
    piece = _chunk(b"y" * (1 << 20))
    for _ in range(50):  # one 50 MB event
        writer.write(piece)
        await writer.drain()


@pytest.mark.parametrize("handler", [_endless, _one_huge_event], ids=["endless", "50mb_event"])
def test_oversized_streams_are_cut_with_memory_bounded(handler: Handler) -> None:
    before = _rss_mb()
    error = asyncio.run(asyncio.wait_for(_call(handler), 60))
    assert error.kind == "response_too_large"
    # cap for max_tokens=64 is 16 KiB + 64 x 4 KiB = 272 KiB: far below 50 MB
    assert _rss_mb() - before < 40


def test_cap_is_overridable() -> None:
    async def small(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = (
            b'{"choices":[{"message":{"content":"' + b"z" * 5000 + b'"},"finish_reason":"stop"}]}'
        )
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        await writer.drain()

    error = asyncio.run(_call(small, max_response_bytes=1024))
    assert error.kind == "response_too_large"


async def _bad_status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 OK fine\r\n\r\n")


async def _bad_chunk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + b"zz\r\ndata: x\r\n")


async def _huge_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\n")
    for i in range(5000):
        writer.write(f"X-Pad-{i}: {'p' * 100}\r\n".encode())
    writer.write(b"\r\n")
    await writer.drain()


async def _one_huge_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * (3 << 20) + b"\r\n\r\n")
    await writer.drain()


async def _closed_mid_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/ev")
    await writer.drain()


async def _bad_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n{}")


@pytest.mark.parametrize(
    ("handler", "kind"),
    [
        (_bad_status, "bad_status_line"),
        (_bad_chunk, "bad_chunk"),
        (_huge_headers, "headers_too_large"),
        (_one_huge_header, "headers_too_large"),
        (_closed_mid_headers, "connection"),
        (_bad_length, "bad_header"),
    ],
)
def test_broken_http_has_a_clear_error_type(handler: Handler, kind: str) -> None:
    error = asyncio.run(asyncio.wait_for(_call(handler), 30))
    assert error.kind == kind
    assert "AttributeError" not in str(error) and "LimitOverrun" not in str(error)
    if kind == "connection":
        assert "mid-headers" in str(error)
