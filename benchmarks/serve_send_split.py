"""Can a wave of N requests due at once leave faster than one write after another?

Issue 28 bounds the scheduling lag of a fixed concurrency's first wave at 5 ms p99 for 1,000
streams; one thread needs ~6 µs a loopback write. This script measures the ways around it on
bare sockets (no metrale code: the floor any client could reach), against `_burst_stub.py`
(its own process, 2 s step, so that only first chunks arrive), connections open before:

- **one thread** writes the N requests one after another;
- **two threads**: the main thread writes the even ones, a waiting thread the odd ones
  (`socket.send` releases the GIL, and the loopback write runs the server's receive path in the
  writer's thread, so the two could overlap);
- **two processes**: the same split with a forked child, no GIL between them;
- each **fresh** (the connections carried nothing yet) and **primed** (each carried one
  `GET /models` before: the server's socket then lets its answer carry the acknowledgement of
  the request instead of acknowledging it at once, in the writer's thread).

For each: the wall time from the first write to the last (ms), and the 99th percentile of the
writes' start times after the first, which is the wave's scheduling lag p99. Medians over
`--repeats`, the ways interleaved within each repeat.

    python benchmarks/serve_send_split.py --streams 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _harness import machine

HERE = Path(__file__).resolve().parent
WAYS = ("one thread", "two threads", "two processes")


def request(port: int) -> bytes:
    body = b'{"model":"stub","max_tokens":2,"messages":[{"role":"user","content":"Say it."}],'
    body += b'"stream":true,"stream_options":{"include_usage":true}}'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def connect(port: int, streams: int, primed: bool) -> list[socket.socket]:
    socks = []
    for _ in range(streams):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(sock)
    if primed:
        for sock in socks:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        for sock in socks:  # the stub's answer is one small write: one read holds it
            if b"\r\n\r\n" not in sock.recv(65536):
                raise SystemExit("the stub's answer to GET /models came in pieces")
    for sock in socks:
        sock.setblocking(False)
    time.sleep(0.1)  # under the server's retransmission timeout: a longer idle undoes priming
    return socks


def wave(socks: list[socket.socket], message: bytes, way: str) -> tuple[float, float]:
    starts = [0.0] * len(socks)

    def write(indices: range) -> None:
        for i in indices:
            starts[i] = time.perf_counter()
            socks[i].send(message)

    even, odd = range(0, len(socks), 2), range(1, len(socks), 2)
    if way == "one thread":
        t0 = time.perf_counter()
        write(range(len(socks)))
    elif way == "two threads":
        go = threading.Event()
        helper = threading.Thread(target=lambda: (go.wait(), write(odd)))
        helper.start()
        try:
            time.sleep(0.02)
            t0 = time.perf_counter()
            go.set()
            write(even)
        finally:
            go.set()
            helper.join()
    else:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, write the odd ones, say when
            os.read(r, 1)
            write(odd)
            os._exit(0)
        os.close(r)
        time.sleep(0.02)
        t0 = time.perf_counter()
        os.write(w, b"g")
        write(even)
        os.waitpid(pid, 0)
        os.close(w)
        # the child's stamps stayed in the child: the wave ends when its writes did
        return (time.perf_counter() - t0) * 1e3, float("nan")
    end = time.perf_counter()
    lags = sorted((s - t0) * 1e3 for s in starts)
    return (end - t0) * 1e3, lags[int(0.99 * (len(lags) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.streams < 2 or args.repeats < 1:
        print("--streams must be at least 2 and --repeats at least 1", file=sys.stderr)
        return 2
    stub = subprocess.Popen(
        [sys.executable, str(HERE / "_burst_stub.py"), "--step-ms", "2000", "--tokens", "2"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    try:
        assert stub.stdout is not None
        url = stub.stdout.readline().rsplit(" ", 1)[-1].strip()
        port = int(url.split(":")[2].split("/")[0])
        message = request(port)
        for _ in range(args.repeats):
            for primed in (False, True):
                for way in WAYS:
                    socks = connect(port, args.streams, primed)
                    try:
                        results.setdefault((way, primed), []).append(wave(socks, message, way))
                    finally:
                        time.sleep(0.3)  # the stub's first chunks, before the close
                        for sock in socks:
                            sock.close()
    finally:
        stub.terminate()
        stub.wait(timeout=10)
        if stub.stdout is not None:
            stub.stdout.close()
    print(f"{args.streams} writes due at once, medians of {args.repeats}:")
    print("| connections | way | wave ms | lag p99 ms |\n| --- | --- | ---: | ---: |")
    for (way, primed), runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        lag = statistics.median(r[1] for r in runs)
        print(f"| {'primed' if primed else 'fresh'} | {way} | {wall:.2f} | {lag:.2f} |")
    print(f"{machine()}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
