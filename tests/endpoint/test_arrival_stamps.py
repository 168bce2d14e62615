"""A chunk's time is when its bytes arrived, whatever the client was doing then; the connect is
its own figure, never part of TTFT.

A hand-written stub sends a chunk, holds, sends the next: the test makes the parsing of the
first chunk slow (it blocks the event loop, as a client busy with a burst of 1,000 chunks
does) and checks that the second chunk keeps its own arrival time. Bounds are generous (the
machine is shared): the stub's gap is 60 ms, the parse 400 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from metrale.benchmarks.serve.client import StreamClient
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.endpoint import http, stream, wire
from metrale.endpoint.client import ChatClient, Target

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
GAP_S = 0.06
PARSE_S = 0.4
LAST_GAP_S = 0.6


def _event(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")),
        0,
    )  # fmt: skip
    await reader.readexactly(length)


async def _held_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Chunk 1; GAP_S later chunk 2; LAST_GAP_S later chunk 3 and the end. Keep-alive."""
    try:
        while True:
            await _request(reader)
            writer.write(HEAD + _event("a"))
            await writer.drain()
            await asyncio.sleep(GAP_S)
            writer.write(_event("b"))
            await writer.drain()
            await asyncio.sleep(LAST_GAP_S)
            done = b"data: [DONE]\n\n"
            writer.write(
                _event("c") + _event(None, "stop") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Stub:
    """The stub server on its own event loop in a thread: the client's blocked loop must not
    hold the server's sends back (a real server is another process)."""

    def __init__(self, handler: Handler) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        start = asyncio.start_server(handler, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@contextlib.asynccontextmanager
async def _serve(handler: Handler) -> AsyncIterator[str]:
    stub = _Stub(handler)
    try:
        yield stub.url
    finally:
        stub.close()


@pytest.fixture
def slow_first_parse(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The parser blocks the event loop for PARSE_S on the first chunk of each request."""
    feed = stream.StreamParser.feed
    blocked: list[float] = []

    def slow_feed(self: stream.StreamParser, event: bytes, now: float) -> bool:
        first = not self.times
        result = feed(self, event, now)
        if first and self.times:
            time.sleep(PARSE_S)  # parse work of chunk 1, on the loop's thread
            blocked.append(PARSE_S)
        return result

    monkeypatch.setattr(stream.StreamParser, "feed", slow_feed)
    return blocked


def test_the_parse_of_one_chunk_does_not_move_the_stamp_of_the_next(
    slow_first_parse: list[float],
) -> None:
    async def go() -> RequestRecord:
        async with _serve(_held_stream) as url, StreamClient(Target(base_url=url, model="m")) as c:
            rec = RequestRecord(level=0, index=0, phase="measure", intended_s=0, ready_s=0)
            await c.send(c.prepare({"model": "m", "max_tokens": 3}), rec, 0.0)
            return rec

    rec = asyncio.run(go())
    assert rec.error is None, rec.error
    assert slow_first_parse, "the parse was not slowed: the test tests nothing"
    times = rec.chunk_times_s
    assert len(times) == 3
    # Chunk 2 arrived GAP_S after chunk 1, while chunk 1's parse held the loop for PARSE_S:
    # stamped when read, the gap would be >= PARSE_S.
    assert times[1] - times[0] < PARSE_S / 2, times
    assert times[1] - times[0] >= GAP_S * 0.5, times
    assert LAST_GAP_S * 0.8 <= times[2] - times[1] < LAST_GAP_S + 1.0, times
    # ... and the client's own delay is recorded: arrival of chunk 2 to its processing.
    assert rec.client_lag_s is not None and rec.client_lag_s >= PARSE_S * 0.5


def test_the_chat_client_stamps_on_arrival_too(slow_first_parse: list[float]) -> None:
    async def go() -> list[float] | None:
        async with _serve(_held_stream) as url, ChatClient(Target(base_url=url, model="m")) as c:
            call = await c.chat([{"role": "user", "content": "x"}], record_chunks=True)
            return call.chunk_times_s

    times = asyncio.run(go())
    assert times is not None and len(times) == 3
    assert times[1] - times[0] < PARSE_S / 2, times


def test_without_a_kernel_stamp_the_read_time_is_kept() -> None:
    """`kernel_stamp`: the kernel's receive time, converted to perf_counter; none: `now`."""
    import socket
    import struct

    now = time.perf_counter()
    assert wire.kernel_stamp([], now) == now
    real = time.time() - 0.25
    sec, nsec = int(real), int((real % 1) * 1e9)
    data = struct.pack("qq", sec, nsec)
    if wire.SO_TIMESTAMPNS is not None:
        stamp = wire.kernel_stamp([(socket.SOL_SOCKET, wire.SO_TIMESTAMPNS, data)], now)
        assert 0.2 < now - stamp < 0.35
        # a stamp in the future (a wall clock stepped back) is not believed
        ahead = struct.pack("qq", int(time.time()) + 100, 0)
        assert wire.kernel_stamp([(socket.SOL_SOCKET, wire.SO_TIMESTAMPNS, ahead)], now) == now


async def _quick(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await _request(reader)
            done = b"data: [DONE]\n\n"
            writer.write(
                HEAD + _event("a") + _event(None, "stop")
                + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
            )  # fmt: skip
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


CONNECT_S = 0.3


def test_the_connect_is_recorded_apart_and_not_in_ttft(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow connect (as a far TLS server's handshake): the first request records it as
    `connect_s`, its TTFT starts at the write; the next reuses the connection: no connect."""
    open_wire = http.open_wire

    async def slow_open(*args: object) -> wire.Wire:
        await asyncio.sleep(CONNECT_S)
        return await open_wire(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(http, "open_wire", slow_open)

    async def go() -> list[RequestRecord]:
        async with _serve(_quick) as url, StreamClient(Target(base_url=url, model="m")) as client:
            recs = []
            for i in range(2):
                rec = RequestRecord(level=0, index=i, phase="measure", intended_s=0, ready_s=0)
                await client.send(client.prepare({"model": "m"}), rec, time.perf_counter())
                recs.append(rec)
            return recs

    first, second = asyncio.run(go())
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.connect_s is not None and first.connect_s >= CONNECT_S
    assert first.ttft_s is not None and first.ttft_s < CONNECT_S  # from the write, not the send
    assert first.send_s is not None and first.sent_s is not None
    assert first.sent_s - first.send_s >= CONNECT_S
    assert second.connect_s is None


def test_opening_connections_ahead_spares_every_request_its_connect() -> None:
    async def go() -> tuple[int, list[float | None]]:
        async with _serve(_quick) as url, StreamClient(Target(base_url=url, model="m")) as client:
            opened = await client.pool.open(8)
            recs = [
                RequestRecord(level=0, index=i, phase="measure", intended_s=0, ready_s=0)
                for i in range(8)
            ]
            body = client.prepare({"model": "m"})
            await asyncio.gather(*(client.send(body, r, time.perf_counter()) for r in recs))
            assert all(r.error is None for r in recs), [r.error for r in recs]
            return opened, [r.connect_s for r in recs]

    opened, connects = asyncio.run(go())
    assert opened == 8
    assert connects == [None] * 8


def test_the_chat_client_records_the_connect_of_its_first_call_only() -> None:
    async def go() -> list[float | None]:
        async with _serve(_quick) as url, ChatClient(Target(base_url=url, model="m")) as c:
            calls = [await c.chat([{"role": "user", "content": "x"}]) for _ in range(2)]
            return [call.connect_s for call in calls]

    first, second = asyncio.run(go())
    assert first is not None and first > 0 and second is None


def test_a_pool_looks_its_host_up_once_for_many_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 first requests must not queue 1,000 address lookups in the loop's thread pool."""
    lookups: list[str] = []
    resolve = http.resolve

    async def counting(host: str, port: int) -> list[wire.Address]:
        lookups.append(host)
        await asyncio.sleep(0.05)  # a name server's answer: every connect waits meanwhile
        return await resolve(host, port)

    monkeypatch.setattr(http, "resolve", counting)

    async def go() -> int:
        async with _serve(_quick) as url:
            pool = http.ConnectionPool(url.replace("127.0.0.1", "localhost"))
            try:
                return await pool.open(20)
            finally:
                await pool.close()

    assert asyncio.run(go()) == 20
    assert lookups == ["localhost"]
