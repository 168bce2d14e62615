"""Chunk capacity: metrale's serve client beside a raw client, against aligned bursts.

`_burst_stub.py` (its own process) plays a batching server: every running stream gets a chunk
at the same instant, once a step, so the client sees bursts of `streams` chunks, a chunk rate
of streams / step (a stream's first chunk goes as soon as its request is read). Against it,
interleaved, pair after pair:

- **raw**: the bare minimum, in this script: one asyncio task per stream, `open_connection`,
  one HTTP/1.1 POST, `readline` over the SSE stream and `json.loads` per event, nothing else;
  a content event is stamped when `readline` returns it. TTFT counts from the write (after the
  connect, as metrale's does). Every stream connects before any writes (`--raw-spread`: each
  writes when its own connect ends), so both clients put the same burst of requests on the
  stub: the stub answers a burst one request after another, and a client whose writes are
  spread out sees less of that queue in its TTFT;
- **metrale**: `metrale run serve --concurrency N --requests N` in its own process; its
  records' TTFT, chunk times, scheduling lag and client lag.

For each setting it prints the medians over the pairs of: TTFT p99 and per-gap ITL p99 (every
gap between consecutive chunks of every stream, no division by tokens) for both clients and
their differences, metrale's scheduling lag p99 and client lag p99. The capacity is the largest
chunk rate of the ladder at which metrale's ITL p99 is within 1 ms of the raw client's or
below it (metrale stamps with the kernel's receive time, the raw client when `readline`
returns: when the raw client falls behind, metrale reads truer, not worse) while metrale keeps
up: its ITL p50 within 10% of the step (a client that falls a step behind reads several chunks
at once). A row whose raw client does not keep up by the same test is marked.

    python benchmarks/serve_bursts.py --pairs 3                      # the ladder and 1,000 x 0.83 s
    python benchmarks/serve_bursts.py --settings 1000x30 --pairs 3   # streams x step ms
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from _harness import machine

HERE = Path(__file__).resolve().parent
#: streams x step (ms), tokens: the capacity ladder at a batching server's 30 ms step, and the
#: issue's 1,000 streams 0.83 s apart.
DEFAULT = "100x30x16,250x30x16,500x30x16,1000x30x16,1000x833x5"


def pctl(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Stub:
    def __init__(self, step_ms: float, tokens: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_burst_stub.py"), "--step-ms", str(step_ms),
             "--tokens", str(tokens)],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().rsplit(" ", 1)[-1].strip()

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


async def _raw_stream(
    host: str, port: int, path: str, body: bytes, go: Barrier | None
) -> tuple[float, list[float]]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        if go is not None:
            await go.wait()
        sent = time.perf_counter()
        writer.write(head + body)
        times: list[float] = []
        while True:
            line = await reader.readline()
            if not line:
                raise RuntimeError("raw client: stream ended early")
            if not line.startswith(b"data: "):
                continue
            now = time.perf_counter()
            data = line[6:].strip()
            if data == b"[DONE]":
                return sent, times
            event = json.loads(data)
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    times.append(now - sent)
    finally:
        writer.close()


class Barrier:
    """Every stream connected before any writes: the raw client's requests then leave together,
    as metrale's do (its connections are opened before a fixed-concurrency level)."""

    def __init__(self, parties: int) -> None:
        self.left = parties
        self.event = asyncio.Event()

    async def wait(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.event.set()
        await self.event.wait()


async def raw(url: str, streams: int, tokens: int, together: bool = True) -> dict[str, float]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path.rstrip("/") + "/chat/completions"
    body = json.dumps({
        "model": "stub", "stream": True, "max_tokens": tokens,
        "messages": [{"role": "user", "content": "Say something."}],
    }).encode()  # fmt: skip
    go = Barrier(streams) if together else None
    got = await asyncio.gather(*(_raw_stream(host, port, path, body, go) for _ in range(streams)))
    ttft = [times[0] for _, times in got]
    gaps = [b - a for _, times in got for a, b in itertools.pairwise(times)]
    return {"ttft_p99": pctl(ttft, 99) * 1e3, "itl_p99": pctl(gaps, 99) * 1e3,
            "itl_p50": pctl(gaps, 50) * 1e3}  # fmt: skip


def metrale(url: str, streams: int, tokens: int, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [
            sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--model", "stub",
            "--no-preflight", "--concurrency", str(streams), "--requests", str(streams),
            "--max-tokens", str(tokens), "--prompts", "gsm8k", "--ignore-eos", "false",
            "--out", str(out), *extra,
        ]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"metrale failed: {proc.stderr[-800:]}")
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        level = json.loads((out / "levels.json").read_text())["levels"][0]["metrics"]
    ok = [r for r in records if r["phase"] == "measure" and r["error"] is None]
    if len(ok) != streams:
        raise SystemExit(f"metrale: {streams - len(ok)} requests failed")
    ttft = [r["ttft_s"] for r in ok]
    times = [r["chunk_times_s"] for r in ok]
    gaps = [b - a for t in times for a, b in itertools.pairwise(t)]
    return {
        "ttft_p99": pctl(ttft, 99) * 1e3, "itl_p99": pctl(gaps, 99) * 1e3,
        "itl_p50": pctl(gaps, 50) * 1e3,
        "sched_lag_p99": level.get("sched_lag_ms_p99") or 0.0,
        "client_lag_p99": level.get("client_lag_ms_p99") or 0.0,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=DEFAULT, help="STREAMSxSTEP_MS[xTOKENS],...")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--metrale-args", default="", help="extra flags for metrale run serve")
    ap.add_argument("--raw-spread", action="store_true",
                    help="the raw client writes each request when its own connect ends "
                    "(writes spread over the connects), not all together")  # fmt: skip
    args = ap.parse_args()
    extra = args.metrale_args.split()
    rows = []
    print("| streams | step ms | chunks/s | raw TTFT p99 | metrale TTFT p99 | diff | raw ITL p99 "
          "| metrale ITL p99 | diff | sched lag p99 | client lag p99 | raw keeps up "
          "| metrale keeps up |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for setting in args.settings.split(","):
        streams_s, step_s, *rest = setting.split("x")
        streams, step_ms = int(streams_s), float(step_s)
        tokens = int(rest[0]) if rest else 16
        stub = Stub(step_ms, tokens)
        try:
            asyncio.run(raw(stub.url, 8, tokens))  # warm the stub
            pairs = []
            for i in range(args.pairs):
                first, second = ("raw", "metrale") if i % 2 == 0 else ("metrale", "raw")
                got = {}
                for client in (first, second):
                    got[client] = (
                        asyncio.run(raw(stub.url, streams, tokens, not args.raw_spread))
                        if client == "raw"
                        else metrale(stub.url, streams, tokens, extra)
                    )  # fmt: skip
                pairs.append(got)
                print(f"  pair {i}: " + json.dumps({c: {k: round(v, 2) for k, v in g.items()}
                                                     for c, g in got.items()}),
                      file=sys.stderr, flush=True)  # fmt: skip
        finally:
            stub.close()

        def med(client: str, key: str, pairs: list[dict[str, dict[str, float]]] = pairs) -> float:
            return statistics.median(p[client][key] for p in pairs)

        def dmed(key: str, pairs: list[dict[str, dict[str, float]]] = pairs) -> float:
            return statistics.median(p["metrale"][key] - p["raw"][key] for p in pairs)

        def keeps_up(client: str, step_ms: float = step_ms) -> bool:
            return abs(med(client, "itl_p50") - step_ms) <= 0.1 * step_ms

        row = {
            "streams": streams, "step_ms": step_ms, "chunk_rate": streams / step_ms * 1e3,
            "itl_diff": dmed("itl_p99"), "ttft_diff": dmed("ttft_p99"),
            "kept_up": keeps_up("metrale"),
        }  # fmt: skip
        rows.append(row)
        print(
            f"| {streams} | {step_ms:g} | {row['chunk_rate']:,.0f} | "
            f"{med('raw', 'ttft_p99'):.1f} | "
            f"{med('metrale', 'ttft_p99'):.1f} | {row['ttft_diff']:+.1f} | "
            f"{med('raw', 'itl_p99'):.1f} | {med('metrale', 'itl_p99'):.1f} | "
            f"{row['itl_diff']:+.1f} | {med('metrale', 'sched_lag_p99'):.2f} | "
            f"{med('metrale', 'client_lag_p99'):.2f} | {'yes' if keeps_up('raw') else 'no'} | "
            f"{'yes' if keeps_up('metrale') else 'no'} |",
            flush=True,
        )
    kept = [r["chunk_rate"] for r in rows if r["itl_diff"] <= 1.0 and r["kept_up"]]
    print(f"\nlargest chunk rate with metrale's ITL p99 within 1 ms of the raw client's (or "
          "below), metrale keeping up: "
          f"{max(kept):,.0f} chunks/s" if kept else "\nno setting within 1 ms")  # fmt: skip
    print(f"medians of {args.pairs} interleaved pairs (differences: median of per-pair "
          f"differences, ms); {machine()}, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
