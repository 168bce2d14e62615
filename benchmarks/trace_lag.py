"""Trace replay's scheduling lag: do requests leave at their recorded offsets?

A 200-line Mooncake-format trace (seeded: 8 conversations growing block by block and one-off
requests, gaps of 0-20 ms, ~2 s in all, prompts of 1-4 blocks of 512 tokens) replayed by
`metrale run serve --trace` against a `metrale sim` with a prefix cache, interleaved with its
floor: the same number of requests at a constant rate of the trace's mean rate
(`--load rate --arrivals constant`), the open-loop load whose lag serve already reports. Each
repetition runs both; the figures are the medians over repetitions of each run's lag p50, p99
and max (send − intended, `sched_lag_ms_*`).

Usage: python benchmarks/trace_lag.py [--reps 5] [--lines 200]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim

BLOCK = 512


def write_trace(path: Path, lines: int, seed: int = 3) -> float:
    """The trace (as tests/benchmarks/serve/test_trace.py writes it); returns its span in s."""
    rng = random.Random(seed)
    rows, t, next_id = [], 0, 1000
    contexts: dict[int, list[int]] = {c: [c * 10] for c in range(8)}
    for _ in range(lines):
        t += rng.randint(0, 20)
        if rng.random() < 0.7:
            ids = contexts[rng.randrange(8)]
            if rng.random() < 0.5 and len(ids) < 4:
                ids.append(next_id)
                next_id += 1
            hash_ids = list(ids)
        else:
            hash_ids = [next_id, next_id + 1]
            next_id += 2
        length = (len(hash_ids) - 1) * BLOCK + rng.randint(1, BLOCK)
        rows.append({"timestamp": t, "input_length": length,
                     "output_length": rng.randint(2, 12), "hash_ids": hash_ids})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return t / 1000.0


def serve(url: str, out: Path, *flags: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--no-preflight",
           "--no-ignore-eos", "--out", str(out), "--quiet", *flags]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"serve failed: {proc.stderr}")
    metrics: dict[str, float] = json.loads((out / "result.json").read_text())["result"]["metrics"]
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lines", type=int, default=200)
    args = ap.parse_args()
    keys = ("sched_lag_ms_p50", "sched_lag_ms_p99", "sched_lag_ms_max")
    runs: dict[str, list[dict[str, float]]] = {"trace": [], "constant": []}
    with tempfile.TemporaryDirectory() as tmp, sim("--prefix-cache-tokens", "10000000") as url:
        trace = Path(tmp) / "trace.jsonl"
        span = write_trace(trace, args.lines)
        rate = (args.lines - 1) / span
        for rep in range(args.reps):
            runs["trace"].append(serve(url, Path(tmp) / f"t{rep}", "--trace", str(trace)))
            runs["constant"].append(serve(
                url, Path(tmp) / f"c{rep}", "--load", "rate", "--rate", f"{rate:.3f}",
                "--arrivals", "constant", "--requests", str(args.lines), "--input-tokens", "1000",
                "--max-tokens", "8",
            ))  # fmt: skip
            time.sleep(0.2)
    print(f"{args.lines}-line trace over {span:.2f} s (mean {rate:.0f} req/s), {args.reps} reps")
    print(f"{'load':<10}" + "".join(f"{k.removeprefix('sched_lag_'):>14}" for k in keys))
    for name, rows in runs.items():
        cells = "".join(f"{statistics.median(r[k] for r in rows):>14.3f}" for k in keys)
        print(f"{name:<10}{cells}")
    print(machine())


if __name__ == "__main__":
    main()
