"""A lean HTTP/1.1 client for the measuring path: POST a body, stream the response's bytes.

Why not aiohttp here: at a thousand concurrent calls its per-request machinery (middlewares,
cookie and header objects, tracing hooks) cost ~0.27 ms of CPU per call on a 2-core machine,
half of metrale's whole per-rollout budget, and it shows as time to first token. This client
does only what an OpenAI-compatible endpoint needs: keep-alive connections in a pool per
host, `Content-Length`, chunked and read-to-close bodies, TLS for https, one deadline per
request. Every call metrale makes to a target goes through it: the chat client of rollouts
and serve's load client (`endpoint.stream.exchange`), serve's `/tokenize` calls, the probe's
`GET /models` and the local launcher's readiness poll. (aiohttp remains for the simulator's
server.)

Every connection is a `wire.Wire`: what it receives comes stamped with its arrival time (the
kernel's receive time on plain TCP), and a body is read one arrival at a time
(`Response.next_piece`), its framing removed without a further wait, so that a streamed
response's events keep the time their bytes arrived.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from metrale.endpoint.framing import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_LINE_BYTES,
    Chunked,
    Fixed,
    Framing,
    HttpConnectionError,
    HttpProtocolError,
    ToClose,
    content_length,
)
from metrale.endpoint.wire import Address, Wire, open_wire, resolve

__all__ = ["ConnectionPool", "HttpConnectionError", "HttpProtocolError", "Outgoing", "Response"]


@dataclass
class Response:
    """A response whose status and headers were read; the body is the caller's to read.

    `sent_at` is the `perf_counter()` at which the request was written to an open connection;
    `connect_s` the connect (and TLS handshake) time of a fresh connection, None on a reused
    one: the two are apart so that a response's times can start at the write.
    """

    status: int
    headers: dict[str, str]
    _conn: _Connection = field(repr=False)
    _pool: ConnectionPool = field(repr=False)
    sent_at: float = 0.0
    connect_s: float | None = None
    _done: bool = False
    _framing: Framing | None = field(default=None, repr=False)
    _cap: int | None = field(default=None, repr=False)
    _seen: int = 0

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    def _start(self, max_bytes: int | None) -> Framing:
        length = self.headers.get("content-length")
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            framing: Framing = Chunked()
        elif length is not None:
            framing = Fixed(content_length(length))
        else:
            self._conn.reusable = False
            framing = ToClose()
        self._framing, self._cap = framing, max_bytes
        return framing

    async def next_piece(self, max_bytes: int | None = None) -> tuple[bytes, float] | None:
        """The body's next arrival, framing removed, with its arrival stamp (`perf_counter`);
        None at the end of the body. Past `max_bytes` of body (the first call's) it raises
        `HttpProtocolError("response_too_large")` and the connection is not reused: an endless
        or huge body costs at most that much memory."""
        framing = self._framing or self._start(max_bytes)
        arrivals = self._conn.wire.arrivals
        while not self._done:
            try:
                got = await arrivals.next()
            except ConnectionError as exc:
                self._conn.reusable = False
                raise HttpConnectionError(f"{type(exc).__name__}: {exc}") from None
            if got is None:
                self._conn.reusable = False
                self._done = True
                framing.closed()
                return None
            if payload := self._take(*got):
                return payload, got[1]
        return None

    def _take(self, raw: bytes, stamp: float) -> bytes:
        """One arrival through the framing and the cap: its payload (`_done` set at the end)."""
        assert self._framing is not None
        try:
            payload, rest, done = self._framing.feed(raw)
        except HttpProtocolError:
            self._conn.reusable = False
            raise
        if rest:
            self._conn.wire.arrivals.unread(rest, stamp)
        self._seen += len(payload)
        if self._cap is not None and self._seen > self._cap:
            self._conn.reusable = False
            raise HttpProtocolError(
                "response_too_large",
                f"response body over the cap of {self._cap} bytes (--max-response-kb)",
            )
        self._done = done
        return payload

    async def consume(self, on_piece: PieceFn, max_bytes: int | None = None) -> None:
        """Hand the body to `on_piece(payload, stamp)` piece by piece, until it returns True or
        the body ends; what has not arrived yet is handed over in the connection's read
        callback as it arrives (`wire.Arrivals.divert`), with no task switch per piece. Errors
        are those of `next_piece`, and whatever `on_piece` raises."""
        if self._framing is None:
            self._start(max_bytes)
        arrivals = self._conn.wire.arrivals
        while not self._done and (got := arrivals.take()) is not None:
            payload = self._take(*got)
            if payload and on_piece(payload, got[1]):
                return
        if self._done:
            return
        if arrivals.closed:
            if (got := await self.next_piece()) is not None:  # the end, or its error
                on_piece(*got)
            return
        sink = _Sink(self, on_piece, asyncio.get_running_loop().create_future())
        arrivals.divert(sink)
        try:
            await sink.finished
        finally:
            arrivals.divert(None)

    async def iter_chunks(self, max_bytes: int | None = None) -> AsyncIterator[bytes]:
        """The body in the pieces the socket delivers (framing removed). The body is one
        stream: a later call (to drain what a caller stopped reading) goes on where the last one
        stopped, with the first call's cap."""
        while (piece := await self.next_piece(max_bytes)) is not None:
            yield piece[0]

    async def read(self, max_bytes: int | None = None) -> bytes:
        return b"".join([piece async for piece in self.iter_chunks(max_bytes)])

    async def error_text(self, keep: int) -> str:
        """The start of an error response's body; a huge or broken one is not read to its end."""
        try:
            body = await self.read(64 * 1024)
        except (HttpProtocolError, HttpConnectionError):
            return "(body unreadable)"
        return body[:keep].decode(errors="replace").replace("\n", " ")

    def release(self) -> None:
        """Give the connection back when the body was read whole, else close it."""
        reusable = self._done and self._conn.reusable and self._framing is not None
        if reusable and self.headers.get("connection", "").lower() != "close":
            self._pool.put(self._conn)
        else:
            self._conn.close()


PieceFn = Callable[[bytes, float], bool]


class _Sink:
    """`Response.consume`'s side in the connection's read callback."""

    __slots__ = ("finished", "on_piece", "response")

    def __init__(self, response: Response, on_piece: PieceFn, finished: asyncio.Future[None]):
        self.response = response
        self.on_piece = on_piece
        self.finished = finished

    def piece(self, data: bytes, stamp: float) -> None:
        try:
            payload = self.response._take(data, stamp)
            if (payload and self.on_piece(payload, stamp)) or self.response._done:
                self._finish(None)
        except BaseException as exc:
            self._finish(exc)

    def _finish(self, error: BaseException | None) -> None:
        """Detach at once (what arrives next is queued for whoever reads next) and wake the
        reader."""
        self.response._conn.wire.arrivals.divert(None)
        if self.finished.done():
            return
        if error is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(error)

    def end(self, error: BaseException | None) -> None:
        response = self.response
        response._conn.reusable = False
        response._done = True
        try:
            if error is not None:
                raise HttpConnectionError(f"{type(error).__name__}: {error}")
            assert response._framing is not None
            response._framing.closed()
            self._finish(None)
        except BaseException as exc:
            self._finish(exc)


def _status(line: bytes) -> int:
    """The status code of `HTTP/1.x NNN reason`; anything else is not an HTTP response."""
    parts = line.split(b" ", 2)
    if not line.startswith(b"HTTP/1.") or len(parts) < 2 or not parts[1].strip().isdigit():
        raise HttpProtocolError("bad_status_line", f"not an HTTP status line: {line[:60]!r}")
    code = int(parts[1])
    if not 100 <= code <= 599:
        raise HttpProtocolError("bad_status_line", f"status {code} is outside 100..599")
    return code


async def _read_head(wire: Wire) -> tuple[int, dict[str, str]]:
    """The status line and headers; what follows them is put back for the body."""
    arrivals = wire.arrivals
    buf = b""
    status: int | None = None
    while True:
        got = await arrivals.next()
        if got is None:
            where = "before the status line" if status is None else "mid-headers"
            raise HttpConnectionError(f"connection closed {where}")
        buf += got[0]
        if status is None and (eol := buf.find(b"\r\n")) >= 0:
            status = _status(buf[: eol + 2])
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            arrivals.unread(buf[end + 4 :], got[1])
            break
        if len(buf) > MAX_HEADER_BYTES + MAX_LINE_BYTES:
            raise HttpProtocolError(
                "headers_too_large", f"response headers over {MAX_HEADER_BYTES} bytes"
            )
    assert status is not None
    lines = buf[:end].split(b"\r\n")[1:]
    if sum(len(line) + 2 for line in lines) > MAX_HEADER_BYTES or len(lines) > MAX_HEADERS:
        raise HttpProtocolError(
            "headers_too_large",
            f"response headers over {MAX_HEADER_BYTES} bytes or {MAX_HEADERS} lines",
        )
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name.strip():
            raise HttpProtocolError("bad_header", f"not a header line: {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    return status, headers


@dataclass(slots=True)
class Outgoing:
    """A request's bytes, made ready before it is due (`ConnectionPool.outgoing`); `fire`
    writes them, `complete` reads the answer."""

    message: bytes
    #: `perf_counter()` just before the write (the request handed to the connection)
    handed_at: float = 0.0
    #: the connection it was written on, and how much of it went; None: not on one yet
    conn: _Connection | None = None
    written: int = 0


@dataclass
class _Connection:
    wire: Wire
    reusable: bool = True
    #: connect (+ TLS) time, until the connection's first request takes it
    connect_s: float | None = None

    def close(self) -> None:
        self.reusable = False
        self.wire.close()


class ConnectionPool:
    """Keep-alive connections to one origin; unbounded, since callers bound their concurrency."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.https else 80)
        self.path_prefix = parts.path.rstrip("/")
        host_header = self.host if parts.port is None else f"{self.host}:{parts.port}"
        base = {"Host": host_header, "Accept": "*/*", **(headers or {})}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in base.items())
        self._ssl = ssl.create_default_context() if self.https else None
        self._idle: list[_Connection] = []
        self._addresses: list[Address] | None = None
        self._resolving: asyncio.Future[list[Address]] | None = None

    async def _connect(self) -> _Connection:
        started = time.perf_counter()
        try:
            if self._addresses is None and self._ssl is None:
                if self._resolving is None or (
                    self._resolving.done()
                    and (self._resolving.cancelled() or self._resolving.exception() is not None)
                ):  # one lookup for every connect waiting on it; a failed one is asked again
                    self._resolving = asyncio.ensure_future(resolve(self.host, self.port))
                self._addresses = await asyncio.shield(self._resolving)
            wire = await open_wire(self.host, self.port, self._ssl, self._addresses)
        except OSError as exc:
            raise HttpConnectionError(
                f"cannot connect to {self.host}:{self.port}: {exc}", exc
            ) from None
        return _Connection(wire, connect_s=time.perf_counter() - started)

    async def open(self, count: int) -> int:
        """Open up to `count` idle connections ahead of the requests that will use them (a
        warm-up), so that no measured request pays a connect; the number opened."""
        missing = max(count - len(self._idle), 0)
        opened = await asyncio.gather(
            *(self._connect() for _ in range(missing)), return_exceptions=True
        )
        for conn in opened:
            if isinstance(conn, _Connection):
                conn.connect_s = None  # paid before the measured phase, by no request
                self._idle.append(conn)
        return sum(isinstance(c, _Connection) for c in opened)

    def put(self, conn: _Connection) -> None:
        self._idle.append(conn)

    async def get(self, path: str, *, under_base: bool = True) -> Response:
        """One GET (`/models`, a health poll); the same connections and rules as `post`."""
        return await self.request("GET", path, None, under_base=under_base)

    async def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        under_base: bool = True,
    ) -> Response:
        """Send one POST and read the status line and headers; the body is the caller's to read."""
        return await self.request("POST", path, body, headers, under_base=under_base)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        *,
        under_base: bool = True,
    ) -> Response:
        """Send one request and read the status line and headers; the body is the caller's.

        `path` is below the base URL's path (`/chat/completions` under `/v1`), or, with
        `under_base=False`, from the origin's root (`/tokenize`, which servers put beside `/v1`).

        A reused keep-alive connection that the server closed meanwhile fails before any byte of
        a response arrives; that one attempt is repeated once on a fresh connection.
        """
        return await self._deliver(self._message(method, path, body, headers, under_base))

    def _message(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        under_base: bool,
    ) -> bytes:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        length = "" if body is None else f"Content-Length: {len(body)}\r\n"
        head = (
            f"{method} {self.path_prefix if under_base else ''}{path} HTTP/1.1\r\n"
            f"{self._head}{extra}{length}\r\n"
        ).encode("latin-1")
        return head + body if body else head

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.wire.arrivals.at_eof:
                return conn
            conn.close()  # the server closed it while it was idle
        return None

    async def _deliver(self, message: bytes) -> Response:
        while (conn := self._take_idle()) is not None:
            try:
                return await self._exchange(conn, message)
            except HttpConnectionError:
                conn.close()  # stale keep-alive connection: try the next, then a fresh one
        return await self._exchange(await self._connect(), message)

    def outgoing(self, path: str, body: bytes) -> Outgoing:
        """A POST made ready before it is due (its bytes), for `fire` and `complete`."""
        return Outgoing(self._message("POST", path, body, None, True))

    def fire(self, out: Outgoing) -> None:
        """Write a ready request now, without waiting, on an idle open connection: the least
        work between a request's due time and its bytes leaving, so that a wave of requests due
        at once goes out back to back (`handed_at` stamped just before the write). With no idle
        connection, or a write that fails (a stale keep-alive one), `complete` does the rest."""
        out.handed_at = time.perf_counter()
        conn = self._take_idle()
        if conn is None:
            return
        try:
            out.written = conn.wire.write(out.message)
        except ConnectionError:
            conn.close()
            return
        out.conn = conn

    async def complete(self, out: Outgoing) -> Response:
        """The response to a `fire`d request: its status and headers (the body is the caller's).
        A request not yet on a connection goes now, as `request` sends one."""
        conn = out.conn
        if conn is None:
            return await self._deliver(out.message)
        out.conn = None
        try:
            return await self._exchange(conn, out.message, out.written, out.handed_at)
        except HttpConnectionError:
            conn.close()  # stale keep-alive connection: as `request`, once more on another
        return await self._deliver(out.message)

    async def _exchange(
        self, conn: _Connection, message: bytes, written: int = 0, sent_at: float | None = None
    ) -> Response:
        connect_s, conn.connect_s = conn.connect_s, None
        try:
            if sent_at is None:
                sent_at = time.perf_counter()
                await conn.wire.send(message)
            elif written < len(message):
                await conn.wire.send(message[written:])
            status, headers = await _read_head(conn.wire)
        except ConnectionError as exc:
            conn.close()
            raise HttpConnectionError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return Response(
            status=status, headers=headers, _conn=conn, _pool=self, sent_at=sent_at,
            connect_s=connect_s,
        )  # fmt: skip

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
