"""A stub of a batching server: every running stream gets its next chunk at the same instant.

vLLM, SGLang and llama-server emit one chunk for each running sequence at every decode step,
so a client sees bursts of N chunks (N = streams) every step. This stub does only that: a
stream's first chunk goes as soon as its request is read (so that TTFT is the clients' and
the stub's path, not the phase of a step), then it gets one chunk at each step of the shared
clock until it has `--tokens`, then its finish, usage and `[DONE]` in the same write. It
answers `GET /models` (one model, `stub`) and nothing else but `POST .../chat/completions`.
It has no dependency on metrale: it is the independent side of `serve_bursts.py`'s comparison.

    python benchmarks/_burst_stub.py --port 0 --step-ms 30 --tokens 16
    (prints "listening on http://127.0.0.1:PORT/v1", then serves until killed)
"""

from __future__ import annotations

import argparse
import asyncio
import json

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return _frame(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _chunk(content: str | None, finish: str | None = None) -> dict[str, object]:
    delta = {"content": content} if content is not None else {}
    return {
        "id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }  # fmt: skip


class Stub:
    def __init__(self, step_s: float, tokens: int) -> None:
        self.step_s = step_s
        self.tokens = tokens
        self.token = _event(_chunk("tok"))
        usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
        self.end = (
            _event(_chunk(None, "length"))
            + _event({"id": "chatcmpl-stub", "object": "chat.completion.chunk", "choices": [],
                      "usage": usage})
            + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        )  # fmt: skip
        self.running: list[list[object]] = []  # [transport, chunks left]

    async def steps(self) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time()
        while True:
            at += self.step_s
            await asyncio.sleep(max(at - loop.time(), 0))
            running, self.running = self.running, []
            for stream in running:
                transport, left = stream
                if transport.is_closing():  # type: ignore[attr-defined]
                    continue
                left = int(left) - 1  # type: ignore[call-overload]
                if left:
                    transport.write(self.token)  # type: ignore[attr-defined]
                    stream[1] = left
                    self.running.append(stream)
                else:
                    transport.write(self.token + self.end)  # type: ignore[attr-defined]


class Conn(asyncio.Protocol):
    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            path = head.split(b" ", 2)[1]
            if path.endswith(b"/models"):
                body = b'{"object":"list","data":[{"id":"stub","object":"model"}]}'
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            elif path.endswith(b"/chat/completions"):
                if self.stub.tokens == 1:
                    self.transport.write(HEAD + self.stub.token + self.stub.end)
                else:
                    self.transport.write(HEAD + self.stub.token)
                    self.stub.running.append([self.transport, self.stub.tokens - 1])
            else:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--step-ms", type=float, default=30.0)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    stub = Stub(args.step_ms / 1000.0, args.tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(stub), "127.0.0.1", args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}/v1", flush=True)
    await stub.steps()


if __name__ == "__main__":
    asyncio.run(main())
