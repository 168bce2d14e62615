"""Added latency: what metrale's client adds to a TTFT that is known in advance.

`metrale sim --ttft 0.05` answers every request's first token 50 ms after the request arrives.
metrale's serve benchmark runs 100 concurrent requests against it; its TTFT p50 should be within
1 ms of 50 ms. To separate the client from the simulator and the kernel, the same load is also
driven by a bare asyncio-socket client (hand-written HTTP/1.1, one keep-alive connection per
worker, time from write to the first `data:` byte): the floor any Python client can reach on
this machine. Each measurement is repeated and the median quoted.

Usage: python benchmarks/serve_added_latency.py [--repeats 3] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from _harness import sim

CONCURRENCY = 100  # --concurrency changes it
TTFT_S = 0.05


def metrale_ttft(url: str, requests: int, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--no-preflight",
        "--concurrency", str(CONCURRENCY), "--requests", str(requests), "--warmup", "200",
        "--max-tokens", "16", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, capture_output=True, timeout=600, check=False)
    m = json.loads((out / "result.json").read_text())["result"]["metrics"]
    return {"ttft_p50": m["ttft_ms_p50"], "ttft_p90": m["ttft_ms_p90"],
            "rps": m["request_throughput"]}  # fmt: skip


async def raw_ttft(url: str, requests: int) -> dict:
    parts = urlsplit(url)
    body = json.dumps({
        "model": "metrale-sim", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    head = (
        f"POST {parts.path}/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    ttfts: list[float] = []
    left = requests + 200
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            while left > 0:
                left -= 1
                warm = left >= requests
                sent = time.perf_counter()
                writer.write(head + body)
                buf = b""
                while b"data:" not in buf:
                    buf += await reader.read(65536)
                first = time.perf_counter()
                while not buf.endswith(b"0\r\n\r\n"):
                    buf += await reader.read(65536)
                if not warm:
                    ttfts.append((first - sent) * 1000)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    ttfts.sort()
    return {"ttft_p50": statistics.median(ttfts), "ttft_p90": ttfts[int(len(ttfts) * 0.9)],
            "rps": len(ttfts) / (time.perf_counter() - started)}  # fmt: skip


def main() -> None:
    global CONCURRENCY
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=CONCURRENCY)
    args = ap.parse_args()
    CONCURRENCY = args.concurrency
    work = Path(tempfile.mkdtemp(prefix="serve-latency-"))
    rows: dict[str, list[dict]] = {"metrale": [], "raw socket": []}
    with sim("--ttft", str(TTFT_S)) as url:
        for i in range(args.repeats):
            rows["metrale"].append(metrale_ttft(url, args.requests, work / f"m{i}"))
            rows["raw socket"].append(asyncio.run(raw_ttft(url, args.requests)))
    print(f"sim TTFT {TTFT_S * 1000:g} ms, {CONCURRENCY} concurrent, {args.requests} measured "
          f"requests, median of {args.repeats} runs")  # fmt: skip
    print("| client | TTFT p50 ms | TTFT p90 ms | req/s | runs (p50) |")
    print("|---|---|---|---|---|")
    med = {}
    for name, runs in rows.items():
        med[name] = statistics.median(r["ttft_p50"] for r in runs)
        print(f"| {name} | {med[name]:.2f} | {statistics.median(r['ttft_p90'] for r in runs):.2f} "
              f"| {statistics.median(r['rps'] for r in runs):.0f} | "
              + ", ".join(f"{r['ttft_p50']:.2f}" for r in runs) + " |")  # fmt: skip
    print(
        f"\nmetrale TTFT p50 − 50 ms = {med['metrale'] - 50:+.2f} ms; "
        f"metrale − raw socket = {med['metrale'] - med['raw socket']:+.2f} ms"
    )


if __name__ == "__main__":
    main()
