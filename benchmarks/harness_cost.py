"""What metrale itself costs: gsm8k x1,024 against a 1 s sim, side by side with a raw client.

Each pair, interleaved, against one `metrale sim --ttft 1.0` process:

- **raw**: the bare minimum, in this script, making the same calls metrale makes: one asyncio
  task per request (1,024 at once), `open_connection`, one HTTP/1.1 POST, `readline` over the
  SSE stream and `json.loads` per event to `[DONE]`, nothing else: wall clock from the first
  request sent to the last stream ended;
- **metrale**: `metrale run gsm8k --rollouts 1024 --max-tokens 16 --no-preflight` in its own
  process: the rollouts phase (`e2e_s` of result.json), the whole process, and its **start-up**:
  process start to the first rollout's request (the earliest generation start in the records,
  by the wall clock both processes share).

With `--before SRC` (another source tree, e.g. an older commit's `src`), the same metrale run
from that tree too, right after, against the same raw figure. Each tree is byte-compiled first
(`compileall`), as an installed package is: under `PYTHONDONTWRITEBYTECODE` every run would
otherwise compile metrale's sources again, inside its start-up. Beside each run, its CPU
seconds (user + system, `wait4`) and the raw client's (`process_time`).

Targets (issue 27): metrale's rollouts phase <= 1.10 x raw (median of the pairs); start-up <=
250 ms (the preflight aside: it runs beside the first rollouts, `--preflight` measures that;
`benchmarks/startup.py` measures start-up alone, over more runs).

    python benchmarks/harness_cost.py --rollouts 1024 --pairs 3 [--before /tmp/base/src]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from _harness import machine, sim


async def one_call(host: str, port: int, path: str, body: bytes) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"raw client: {status!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        while True:  # chunked SSE until the [DONE] event, json.loads per event
            line = await reader.readline()
            if not line:
                raise RuntimeError("raw client: stream ended early")
            if line.startswith(b"data: "):
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                json.loads(data)
    finally:
        writer.close()


async def raw_client(url: str, n: int) -> float:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path.rstrip("/") + "/chat/completions"
    bodies = [
        json.dumps({
            "model": "metrale-sim", "stream": True, "max_tokens": 16, "temperature": 0.0,
            "seed": i, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"question {i}"}],
        }).encode()
        for i in range(n)
    ]  # fmt: skip
    started = time.perf_counter()
    await asyncio.gather(*(one_call(host, port, path, b) for b in bodies))
    return time.perf_counter() - started


def metrale_run(url: str, n: int, src: str, preflight: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
                "--model", "metrale-sim", "--rollouts", str(n), "--max-tokens", "16",
                *([] if preflight else ["--no-preflight"]), "--out", str(out)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": src}
        wall0, started = time.time(), time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
        process_s = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"metrale failed: {stderr[-1000:]}")
        result = json.loads((out / "result.json").read_text())["result"]
        first_call = min(
            json.loads(line)["stages"]["generation"]["started_at"]
            for line in (out / "rollouts.jsonl").read_text().splitlines()
        )
    return {
        "metrale_s": result["metrics"]["e2e_s"],
        "process_s": process_s,
        "startup_s": first_call - wall0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "errors": result["metrics"]["errors"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--preflight", action="store_true", help="metrale runs its 2+2 preflight")
    ap.add_argument("--before", metavar="SRC", help="also run metrale from this source tree")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent / "src")
    trees = {"now": here, **({"before": args.before} if args.before else {})}
    for src in trees.values():
        compileall.compile_dir(src, quiet=1)
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with sim("--ttft", str(args.latency), "--output-tokens", "16") as url:
        asyncio.run(raw_client(url, 16))  # warm the sim
        for i in range(args.pairs):
            cpu0 = time.process_time()
            raw_s = asyncio.run(raw_client(url, args.rollouts))
            raw_cpu = time.process_time() - cpu0
            for label, src in trees.items():
                row = {"raw_s": raw_s, "raw_cpu_s": raw_cpu,
                       **metrale_run(url, args.rollouts, src, args.preflight)}  # fmt: skip
                row["ratio"] = row["metrale_s"] / raw_s
                rows[label].append(row)
                shown = json.dumps({k: round(v, 3) for k, v in row.items()})
                print(f"pair {i} {label}: {shown}", flush=True)
    for label, cell in rows.items():
        med = {k: round(statistics.median(r[k] for r in cell), 3) for k in cell[0]}
        pairs = " / ".join(f"{r['ratio']:.3f}" for r in cell)
        print(f"median {label}: " + json.dumps(med))
        print(f"  {label}: rollouts phase / raw per pair {pairs}; median {med['ratio']} "
              f"(<= 1.10); start-up {med['startup_s'] * 1000:.0f} ms (<= 250 ms)")  # fmt: skip
    print(machine() + f", load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
