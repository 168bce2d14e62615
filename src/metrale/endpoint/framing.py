"""How an HTTP/1.1 response body is delimited (a length, chunked coding, or the connection's
close), and the transport's two errors.

Framing is synchronous: fed the bytes of one arrival, it gives back the payload in them at
once, so that reading a streamed body costs one wait per arrival and no more (`http.Response`).
"""

from __future__ import annotations

#: Bounds on what a server may send before the body: more is not an HTTP server we measure.
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 256
#: A chunk-size line or a trailer line longer than this is not HTTP we measure.
MAX_LINE_BYTES = 64 * 1024


class HttpConnectionError(Exception):
    """The connection failed or closed before the response was complete (worth a retry).
    `os_error` is the socket's error when connecting failed (refused, DNS, TLS), for callers
    that name the cause to a user."""

    def __init__(self, message: str, os_error: OSError | None = None) -> None:
        super().__init__(message)
        self.os_error = os_error


class HttpProtocolError(Exception):
    """The server broke HTTP/1.1 or a bound (`kind`: bad_status_line, bad_header,
    headers_too_large, bad_chunk, response_too_large). Not retried: a broken server stays
    broken, and a benchmark wants it to show."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def content_length(text: str) -> int:
    if not text.isdigit():
        raise HttpProtocolError("bad_header", f"Content-Length is not a length: {text[:40]!r}")
    return int(text)


class Framing:
    """How one body is delimited: fed raw bytes as they arrive, it gives back the payload in
    them, what follows the body (`rest`), and whether the body ended; synchronous, so that a
    piece costs no further wait."""

    def feed(self, raw: bytes) -> tuple[bytes, bytes, bool]:
        raise NotImplementedError

    def closed(self) -> None:
        """The connection closed: fine for a body read to close, an error otherwise."""
        raise HttpConnectionError("connection closed mid-body")


class ToClose(Framing):
    def feed(self, raw: bytes) -> tuple[bytes, bytes, bool]:
        return raw, b"", False

    def closed(self) -> None:
        return None


class Fixed(Framing):
    __slots__ = ("left",)

    def __init__(self, length: int) -> None:
        self.left = length

    def feed(self, raw: bytes) -> tuple[bytes, bytes, bool]:
        if len(raw) < self.left:
            self.left -= len(raw)
            return raw, b"", False
        left, self.left = self.left, 0
        return raw[:left], raw[left:], True

    def closed(self) -> None:
        if self.left:
            super().closed()


_SIZE, _DATA, _DATA_END, _TRAILERS, _END = range(5)


class Chunked(Framing):
    """Chunked transfer coding; a chunk's data is passed on as it arrives (never a whole chunk
    held: a server may announce a chunk of any size)."""

    __slots__ = ("held", "left", "state", "trailer_bytes")

    def __init__(self) -> None:
        self.state = _SIZE
        self.left = 0
        self.held = b""
        self.trailer_bytes = 0

    def feed(self, raw: bytes) -> tuple[bytes, bytes, bool]:
        buf = self.held + raw if self.held else raw
        self.held = b""
        out: list[bytes] = []
        i, n = 0, len(buf)
        while i < n:
            if self.state == _DATA:
                take = min(self.left, n - i)
                out.append(buf[i : i + take])
                i += take
                self.left -= take
                if not self.left:
                    self.state = _DATA_END
                continue
            j = buf.find(b"\r\n", i)
            if j < 0:
                self._hold(buf[i:])
                break
            line, i = buf[i:j], j + 2
            if self.state == _DATA_END:
                if line:
                    raise HttpProtocolError("bad_chunk", "chunk data not followed by CRLF")
                self.state = _SIZE
            elif self.state == _SIZE:
                self.left = _chunk_size(line)
                self.state = _DATA if self.left else _TRAILERS
            elif line:  # a trailer: nothing we use, but bounded
                self.trailer_bytes += len(line) + 2
                if self.trailer_bytes > MAX_HEADER_BYTES:
                    raise HttpProtocolError("headers_too_large", "trailers over 64 KiB")
            else:
                self.state = _END
                return b"".join(out), buf[i:], True
        return b"".join(out), b"", False

    def _hold(self, rest: bytes) -> None:
        if self.state == _DATA_END and rest not in (b"", b"\r"):
            raise HttpProtocolError("bad_chunk", "chunk data not followed by CRLF")
        if len(rest) > MAX_LINE_BYTES:
            raise HttpProtocolError("bad_chunk", "chunk-size line too long")
        self.held = rest

    def closed(self) -> None:
        where = "mid-chunk" if self.state == _DATA else "mid-body"
        raise HttpConnectionError(f"connection closed {where}")


def _chunk_size(line: bytes) -> int:
    field = line.split(b";", 1)[0].strip()
    try:
        size = int(field, 16)
    except ValueError:
        raise HttpProtocolError("bad_chunk", f"bad chunk size {field[:40]!r}") from None
    if size < 0:
        raise HttpProtocolError("bad_chunk", f"bad chunk size {field[:40]!r}")
    return size
