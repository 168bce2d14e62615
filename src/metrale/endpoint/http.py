"""A lean HTTP/1.1 client for the measuring path: POST a body, stream the response's bytes.

Why not aiohttp here: at a thousand concurrent calls its per-request machinery (middlewares,
cookie and header objects, tracing hooks) cost ~0.27 ms of CPU per call on a 2-core machine,
half of metrale's whole per-rollout budget, and it shows as time to first token. This client
does only what an OpenAI-compatible endpoint needs: keep-alive connections in a pool per
host, `Content-Length`, chunked and read-to-close bodies, TLS for https, one deadline per
request. Probes and other one-off calls still use aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

#: Bounds on what a server may send before the body: more is not an HTTP server we measure.
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 256


class HttpConnectionError(Exception):
    """The connection failed or closed before the response was complete (worth a retry)."""


class HttpProtocolError(Exception):
    """The server broke HTTP/1.1 or a bound (`kind`: bad_status_line, bad_header,
    headers_too_large, bad_chunk, response_too_large). Not retried: a broken server stays
    broken, and a benchmark wants it to show."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    _conn: _Connection = field(repr=False)
    _pool: ConnectionPool = field(repr=False)
    _done: bool = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    async def iter_chunks(self, max_bytes: int | None = None) -> AsyncIterator[bytes]:
        """The body in the pieces the socket delivers (chunked framing removed). Past
        `max_bytes` of body it raises `HttpProtocolError("response_too_large")` and the
        connection is not reused: an endless or huge body costs at most that much memory."""
        reader = self._conn.reader
        seen = 0
        try:
            length = self.headers.get("content-length")
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                pieces = _dechunk(reader)
            elif length is not None:
                pieces = _fixed(reader, _content_length(length))
            else:
                self._conn.reusable = False
                pieces = _to_close(reader)
            async for piece in pieces:
                seen += len(piece)
                if max_bytes is not None and seen > max_bytes:
                    self._conn.reusable = False
                    raise HttpProtocolError(
                        "response_too_large",
                        f"response body over the cap of {max_bytes} bytes (--max-response-kb)",
                    )
                yield piece
            self._done = True
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise HttpConnectionError(f"{type(exc).__name__}: {exc}") from None

    async def read(self, max_bytes: int | None = None) -> bytes:
        return b"".join([piece async for piece in self.iter_chunks(max_bytes)])

    def release(self) -> None:
        """Give the connection back when the body was read whole, else close it."""
        reusable = self._done and self._conn.reusable
        if reusable and self.headers.get("connection", "").lower() != "close":
            self._pool.put(self._conn)
        else:
            self._conn.close()


def _content_length(text: str) -> int:
    if not text.isdigit():
        raise HttpProtocolError("bad_header", f"Content-Length is not a length: {text[:40]!r}")
    return int(text)


async def _fixed(
    reader: asyncio.StreamReader, remaining: int, where: str = "mid-body"
) -> AsyncIterator[bytes]:
    while remaining > 0:
        data = await reader.read(min(remaining, 1 << 16))
        if not data:
            raise HttpConnectionError(f"connection closed {where}")
        remaining -= len(data)
        yield data


async def _to_close(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while data := await reader.read(1 << 16):
        yield data


async def _dechunk(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """Chunked transfer coding, each chunk passed on as it arrives (never a whole chunk held:
    a server may announce a chunk of any size)."""
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise HttpProtocolError("bad_chunk", "chunk-size line too long") from None
        field = line.split(b";", 1)[0].strip()
        try:
            size = int(field, 16)
        except ValueError:
            raise HttpProtocolError("bad_chunk", f"bad chunk size {field[:40]!r}") from None
        if size < 0:
            raise HttpProtocolError("bad_chunk", f"bad chunk size {field[:40]!r}")
        if size == 0:
            trailer_bytes = 0
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                trailer_bytes += len(trailer)  # trailers: nothing we use, but bounded
                if trailer_bytes > MAX_HEADER_BYTES:
                    raise HttpProtocolError("headers_too_large", "trailers over 64 KiB")
            return
        async for data in _fixed(reader, size, "mid-chunk"):
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise HttpProtocolError("bad_chunk", "chunk data not followed by CRLF")


def _status(line: bytes) -> int:
    """The status code of `HTTP/1.x NNN reason`; anything else is not an HTTP response."""
    parts = line.split(b" ", 2)
    if not line.startswith(b"HTTP/1.") or len(parts) < 2 or not parts[1].strip().isdigit():
        raise HttpProtocolError("bad_status_line", f"not an HTTP status line: {line[:60]!r}")
    code = int(parts[1])
    if not 100 <= code <= 599:
        raise HttpProtocolError("bad_status_line", f"status {code} is outside 100..599")
    return code


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reusable: bool = True

    def close(self) -> None:
        self.reusable = False
        self.writer.close()


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

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl else None,
                limit=1 << 20,
            )
        except OSError as exc:  # chained: the probe tells DNS from refused by the cause
            raise HttpConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return _Connection(reader, writer)

    def put(self, conn: _Connection) -> None:
        self._idle.append(conn)

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> Response:
        """Send one POST and read the status line and headers; the body is the caller's to read.

        A reused keep-alive connection that the server closed meanwhile fails before any byte of
        a response arrives; that one attempt is repeated once on a fresh connection.
        """
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"POST {self.path_prefix}{path} HTTP/1.1\r\n{self._head}{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        while self._idle:
            conn = self._idle.pop()
            try:
                return await self._exchange(conn, head, body)
            except HttpConnectionError:
                conn.close()  # stale keep-alive connection: try the next, then a fresh one
        return await self._exchange(await self._connect(), head, body)

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> Response:
        """One GET on a fresh connection (the probe's `GET /models`); the body is the caller's."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = f"GET {self.path_prefix}{path} HTTP/1.1\r\n{self._head}{extra}\r\n"
        return await self._exchange(await self._connect(), head.encode("latin-1"), b"")

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes) -> Response:
        status: int | None = None
        try:
            conn.writer.write(head + body)
            status_line = await conn.reader.readuntil(b"\r\n")
            status = _status(status_line)
            headers: dict[str, str] = {}
            size = 0
            while (line := await conn.reader.readuntil(b"\r\n")) != b"\r\n":
                size += len(line)
                if size > MAX_HEADER_BYTES or len(headers) >= MAX_HEADERS:
                    raise HttpProtocolError(
                        "headers_too_large",
                        f"response headers over {MAX_HEADER_BYTES} bytes or {MAX_HEADERS} lines",
                    )
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep or not name.strip():
                    raise HttpProtocolError("bad_header", f"not a header line: {line[:60]!r}")
                headers[name.strip().lower()] = value.strip()
        except asyncio.LimitOverrunError:
            conn.close()
            raise HttpProtocolError(
                "headers_too_large", "a response header line is over the reader's limit"
            ) from None
        except asyncio.IncompleteReadError:
            conn.close()
            where = "before the status line" if status is None else "mid-headers"
            raise HttpConnectionError(f"connection closed {where}") from None
        except ConnectionError as exc:
            conn.close()
            raise HttpConnectionError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        assert status is not None
        return Response(status=status, headers=headers, _conn=conn, _pool=self)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await conn.writer.wait_closed()
