"""Client CPU per call: what one request costs metrale's own process, for both clients.

Both clients send through the endpoint layer's one path (`endpoint.http` + `endpoint.stream`):
`ChatClient` (rollouts: retries, text kept) and serve's `StreamClient` (no retries, no text,
a pre-encoded body). Each runs `--calls` requests, `--concurrency` at a time, against a
`metrale sim` in its own process (zero latency, 16 tokens, usage on), after a warm-up; the figure
is the process CPU time (all threads) over the measured calls, divided by their number. CPU, not
wall time: on a shared machine it is the figure that stays put when other work holds the cores,
and it is what bounds the request rate one client process can drive.

    python benchmarks/client_cpu.py [--calls 4096] [--concurrency 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _harness import machine, sim

from metrale.benchmarks.serve.client import StreamClient
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.endpoint.client import ChatClient, Target

MESSAGES = [{"role": "user", "content": "What is 2+2? " * 10}]


async def chat_cpu(target: Target, calls: int, concurrency: int) -> float:
    async with ChatClient(target) as client:

        async def worker(n: int) -> None:
            for _ in range(n):
                await client.chat(MESSAGES, max_tokens=16)

        return await _measure(worker, calls, concurrency)


async def serve_cpu(target: Target, calls: int, concurrency: int) -> float:
    async with StreamClient(target) as client:
        request = client.prepare({"model": target.model, "messages": MESSAGES, "max_tokens": 16})
        t0 = time.perf_counter()

        async def worker(n: int) -> None:
            for i in range(n):
                record = RequestRecord(level=0, index=i, phase="measure", intended_s=0.0,
                                       ready_s=0.0)  # fmt: skip
                await client.send(request, record, t0)
                if record.error is not None:
                    raise RuntimeError(record.error)

        return await _measure(worker, calls, concurrency)


async def _measure(worker, calls: int, concurrency: int) -> float:  # type: ignore[no-untyped-def]
    """Warm up (connections, caches), then CPU µs per call over `calls` calls."""
    await asyncio.gather(*(worker(8) for _ in range(concurrency)))
    cpu0 = time.process_time()
    await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
    return (time.process_time() - cpu0) / (calls // concurrency * concurrency) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=4096)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows: dict[str, list[float]] = {"chat client": [], "serve client": []}
    with sim() as url:
        target = Target(base_url=url, model="metrale-sim")
        for _ in range(args.repeats):  # interleaved, so that drift hits both alike
            rows["chat client"].append(asyncio.run(chat_cpu(target, args.calls, args.concurrency)))
            rows["serve client"].append(
                asyncio.run(serve_cpu(target, args.calls, args.concurrency))
            )
    print(machine())
    print(f"{args.calls} calls, {args.concurrency} concurrent, 16 tokens, median of "
          f"{args.repeats}")  # fmt: skip
    print("| client | CPU µs a call (median) | runs |")
    print("|---|---|---|")
    for name, runs in rows.items():
        print(f"| {name} | {statistics.median(runs):.1f} | "
              + ", ".join(f"{r:.1f}" for r in runs) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
