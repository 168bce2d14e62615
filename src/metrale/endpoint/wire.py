"""One connection's bytes, each piece stamped with the moment it arrived.

Why not asyncio's streams: a chunk's time must be the time its bytes reached this machine, not
the time a busy event loop got round to it. At 1,000 streams a batching server sends 1,000
chunks in the same instant; while the client works through that burst, the next one is already
waiting in the socket buffers, and a stamp taken when it is read belongs to the client.

So a plain TCP connection asks the kernel for the receive time of what it reads
(`SO_TIMESTAMPNS`: the time the packet reached the socket, on the wall clock); each read is
stamped with it, converted to `time.perf_counter()` by subtracting how long ago it was. No
parsing, decoding or bookkeeping can move that stamp: it was taken before any of it, by the
kernel. Where the kernel gives none (TLS, whose records the loop's SSL protocol decrypts; a
platform without the option) the stamp is `perf_counter()` in the protocol's `data_received`,
the first Python code that sees the bytes, before any parsing.

One read that holds bytes of several packets gets the stamp of the newest (the kernel keeps
one per read): it happens only when the client fell a whole chunk interval behind, which the
client-lag figure (arrival to processed, `endpoint.stream`) shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

#: Linux's SO_TIMESTAMPNS (the "old" 64-bit timespec form; the Python module does not name it).
SO_TIMESTAMPNS: int | None = getattr(
    socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None
)
READ_BYTES = 1 << 16
ANC_BYTES = 64
#: Stop reading a connection whose reader holds this much unread (resume below half of it):
#: a caller that stops reading must not make the buffer grow without bound.
HIGH_WATER = 1 << 20
_TIMESPEC = struct.Struct("qq")


class Arrivals:
    """The pieces a connection received, in order, each with its arrival stamp (perf_counter)."""

    __slots__ = (
        "_eof", "_error", "_paused", "_pieces", "_sink", "_size", "_waiter", "pause", "resume",
    )  # fmt: skip

    def __init__(self) -> None:
        self._pieces: deque[tuple[bytes, float]] = deque()
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.pause: Callable[[], None] | None = None
        self.resume: Callable[[], None] | None = None
        self._sink: Sink | None = None

    def divert(self, sink: Sink | None) -> None:
        """Hand each piece to `sink` as it arrives, in the connection's read callback, instead
        of queueing it for `next` (None: queue again). A streamed body is then processed with
        no task switch per chunk; its stamp was taken before, all the same."""
        self._sink = sink

    def feed(self, data: bytes, stamp: float) -> None:
        if self._sink is not None and not self._pieces:
            self._sink.piece(data, stamp)
            return
        self._pieces.append((data, stamp))
        self._size += len(data)
        if self._size > HIGH_WATER and self.pause is not None and not self._paused:
            self._paused = True
            self.pause()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        if self._sink is not None:
            self._sink.end(None)
        self._wake()

    def fail(self, error: BaseException) -> None:
        self._error = error
        if self._sink is not None:
            self._sink.end(error)
        self._wake()

    def take(self) -> tuple[bytes, float] | None:
        """The next queued piece without waiting; None when none is queued."""
        if not self._pieces:
            return None
        data, stamp = self._pieces.popleft()
        self._size -= len(data)
        if self._paused and self._size < HIGH_WATER // 2 and self.resume is not None:
            self._paused = False
            self.resume()
        return data, stamp

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def at_eof(self) -> bool:
        return self._eof and not self._pieces

    @property
    def closed(self) -> bool:
        """Nothing more will arrive: the end was read, or the connection failed."""
        return self._eof or self._error is not None

    async def next(self) -> tuple[bytes, float] | None:
        """The next piece and its stamp; None at the end of the stream."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self._eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.take()

    def unread(self, data: bytes, stamp: float) -> None:
        """Put back what a caller took but did not use (the start of a body after its headers)."""
        if data:
            self._pieces.appendleft((data, stamp))
            self._size += len(data)


class Sink(Protocol):
    def piece(self, data: bytes, stamp: float) -> None: ...

    def end(self, error: BaseException | None) -> None: ...


class Wire(Protocol):
    arrivals: Arrivals

    def write(self, data: bytes) -> int: ...

    async def send(self, data: bytes) -> None: ...

    def close(self) -> None: ...


def kernel_stamp(ancillary: list[tuple[int, int, bytes]], now: float) -> float:
    """`now` moved back by how long ago the kernel received the bytes (0 without a stamp, and
    never into the future nor more than a minute back: a wall clock stepped meanwhile)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            ago: float = time.time() - (sec + nsec * 1e-9)
            if 0.0 <= ago < 60.0:
                return now - ago
    return now


class SocketWire:
    """A plain TCP connection read with `recvmsg`, each read stamped by the kernel."""

    __slots__ = ("_fd", "_loop", "_reading", "arrivals", "sock")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self.arrivals = Arrivals()
        self.arrivals.pause, self.arrivals.resume = self._stop_reading, self._start_reading
        self._reading = False
        self._start_reading()

    def _start_reading(self) -> None:
        if not self._reading and self._fd >= 0:
            self._loop.add_reader(self._fd, self._readable)
            self._reading = True

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(READ_BYTES, ANC_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._stop_reading()
            self.arrivals.fail(ConnectionResetError(f"{type(exc).__name__}: {exc}"))
            return
        now = time.perf_counter()
        if not data:
            self._stop_reading()
            self.arrivals.feed_eof()
            return
        self.arrivals.feed(data, kernel_stamp(ancillary, now) if ancillary else now)

    def write(self, data: bytes) -> int:
        """Write what the socket takes now, without waiting: the bytes written (a request is
        small: on an open connection, all of them). `ConnectionResetError` when it failed."""
        try:
            return self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            raise ConnectionResetError(f"{type(exc).__name__}: {exc}") from None

    async def send(self, data: bytes) -> None:
        """`write`, then what is left, if anything, when the socket can take it."""
        sent = self.write(data)
        if sent < len(data):
            try:
                await self._loop.sock_sendall(self.sock, data[sent:])
            except OSError as exc:
                raise ConnectionResetError(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._stop_reading()
        self._fd = -1
        self.sock.close()
        self.arrivals.feed_eof()


class _Stamping(asyncio.Protocol):
    """TLS: the loop's SSL protocol hands decrypted bytes here, stamped on arrival."""

    def __init__(self) -> None:
        self.arrivals = Arrivals()

    def data_received(self, data: bytes) -> None:
        self.arrivals.feed(data, time.perf_counter())

    def eof_received(self) -> bool:
        self.arrivals.feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.arrivals.fail(ConnectionResetError(f"{type(exc).__name__}: {exc}"))
        else:
            self.arrivals.feed_eof()


class TransportWire:
    """A connection through an asyncio transport (TLS)."""

    __slots__ = ("arrivals", "transport")

    def __init__(self, transport: asyncio.Transport, protocol: _Stamping) -> None:
        self.transport = transport
        self.arrivals = protocol.arrivals
        self.arrivals.pause, self.arrivals.resume = (
            transport.pause_reading,
            transport.resume_reading,
        )

    def write(self, data: bytes) -> int:
        """The transport takes every byte (it buffers what the socket does not)."""
        if self.transport.is_closing():
            raise ConnectionResetError("connection closed")
        self.transport.write(data)
        return len(data)

    async def send(self, data: bytes) -> None:
        self.write(data)

    def close(self) -> None:
        self.transport.close()


Address = tuple[int, int, int, tuple[Any, ...]]


async def resolve(host: str, port: int) -> list[Address]:
    """The addresses of `host`: a numeric one at once, a name through the loop's resolver
    (a thread). A pool resolves once: 1,000 connects must not queue 1,000 lookups."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, kind, proto, address) for family, kind, proto, _, address in infos]


async def open_wire(
    host: str, port: int, tls: ssl.SSLContext | None, addresses: list[Address] | None = None
) -> Wire:
    """Connect (and shake hands, with `tls`); `OSError` when no address of `host` answers."""
    loop = asyncio.get_running_loop()
    if tls is not None:
        transport, protocol = await loop.create_connection(
            _Stamping, host, port, ssl=tls, server_hostname=host
        )
        return TransportWire(transport, protocol)
    failed: OSError | None = None
    for family, kind, proto, address in addresses or await resolve(host, port):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SO_TIMESTAMPNS is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failed = exc
            continue
        except BaseException:
            sock.close()
            raise
        return SocketWire(sock, loop)
    raise failed or OSError(f"no address for {host}")
