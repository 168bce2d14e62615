"""The cost of sending a fixed concurrency's first wave: N requests due at the same instant.

A level of `--concurrency N` starts N requests at once; one event loop writes them one after
another, so the last one's scheduling lag (send − ready) is the time the client needs per send
times N. This script measures that per-send time on serve's own load path (`run_level` and
`StreamClient`, in this process, connections opened before the level), against
`_burst_stub.py` (its own process) with a step long enough (2 s) that no chunk but each
stream's first arrives while the wave is sent:

- **wall µs a send**: (the last request's send − the level's start) / N, from the records;
- **lag p50 / p99** of the wave (send − ready), the figure issue 28 bounds at 5 ms;
- **CPU µs a request**: process CPU time over the first 0.5 s of the level / N: each request's
  preparation and send, and the reading of its headers and first chunk.

It runs on any tree of metrale (`PYTHONPATH=TREE/src`): where `run_level` takes no `prepare`
(before the wave), requests go through the plain `send`. Medians over `--repeats`.

    python benchmarks/serve_send_wave.py --streams 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _harness import machine

HERE = Path(__file__).resolve().parent
WINDOW_S = 0.5


def pctl(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def wave(url: str, streams: int) -> dict[str, float]:
    from metrale.benchmarks.serve.client import StreamClient
    from metrale.benchmarks.serve.load import Bound, LevelSpec, LevelState, run_level
    from metrale.endpoint.client import Target

    spec = LevelSpec(index=0, label="wave", concurrency=streams, measure=Bound(count=streams))
    records: list[Any] = []
    async with StreamClient(Target(base_url=url, model="stub")) as client:
        opened = await client.pool.open(streams)
        if opened != streams:
            raise SystemExit(f"opened {opened} of {streams} connections")
        messages = [{"role": "user", "content": "Say something."}]
        body = client.prepare({"model": "stub", "max_tokens": 2, "messages": messages})
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if "prepare" in inspect.signature(run_level).parameters:

            def prepare(record: Any) -> Any:
                return client.launch(body, record, t0)

            async def send(record: Any) -> None:
                await prepare(record).finish()

            extra["prepare"] = prepare
        else:

            async def send(record: Any) -> None:
                await client.send(body, record, t0)

        cpu: list[float] = []
        loop = asyncio.get_running_loop()
        loop.call_later(WINDOW_S, lambda: cpu.append(time.process_time()))
        c0 = time.process_time()
        await run_level(spec, send, records.append, LevelState(spec), t0, **extra)
    ok = [r for r in records if r.error is None and r.send_s is not None]
    if len(ok) != streams:
        raise SystemExit(f"{streams - len(ok)} requests failed: {records[0].error}")
    start = min(r.ready_s for r in ok)
    last = max(r.send_s for r in ok)
    if last - start > WINDOW_S:
        raise SystemExit(f"the wave took {last - start:.3f} s, longer than the CPU window")
    lags = [(r.send_s - r.ready_s) * 1e3 for r in ok]
    return {"wall_us": (last - start) / streams * 1e6, "lag_p50": pctl(lags, 50),
            "lag_p99": pctl(lags, 99), "cpu_us": (cpu[0] - c0) / streams * 1e6}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import subprocess

    stub = subprocess.Popen(
        [sys.executable, str(HERE / "_burst_stub.py"), "--step-ms", "2000", "--tokens", "2"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert stub.stdout is not None
        url = stub.stdout.readline().rsplit(" ", 1)[-1].strip()
        runs = []
        for i in range(args.repeats):
            runs.append(asyncio.run(wave(url, args.streams)))
            print(f"  repeat {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()),
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        stub.terminate()
        stub.wait(timeout=10)
        if stub.stdout is not None:
            stub.stdout.close()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    import metrale

    print(f"{args.streams} requests due at once, medians of {args.repeats} "
          f"(metrale from {Path(metrale.__file__).parent.parent.parent}):")  # fmt: skip
    print(f"  wall {med['wall_us']:.1f} µs a send; lag p50 {med['lag_p50']:.2f} ms, "
          f"p99 {med['lag_p99']:.2f} ms; CPU {med['cpu_us']:.1f} µs a request")  # fmt: skip
    print(f"{machine()}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
