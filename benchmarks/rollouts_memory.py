"""Peak memory of `metrale run gsm8k` by rollout count at a fixed concurrency, against the sim.

Each count runs in a fresh process (`ru_maxrss` is a process's peak), 64 rollouts in flight,
the sim answering at once with 4 tokens. With a bounded worker pool, no record kept in memory
and each metric's sample capped (`metrale.rollout.reservoir`), the peak stays flat in the
rollouts done.

Then memory per rollout in flight: `--in-flight N` rollouts against a sim that holds every
answer `--hold` s, once at `--max-concurrent` and once unbounded (all N in flight at once);
the difference in peak RSS over the difference in rollouts in flight is the cost of one
(metrale's own process; with `--runtime bwrap` each rollout's sandbox too, which lives in its
own processes and is counted apart, from the cgroups' `memory.peak` where the host has them).

    python benchmarks/rollouts_memory.py --counts 1000,10000,100000 --max-concurrent 64
    python benchmarks/rollouts_memory.py --counts '' --in-flight 1024 --runtime bwrap
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from _harness import machine, sim

CHILD = """
import asyncio, json, resource, sys, time
from pathlib import Path
from metrale.endpoint.client import Target
from metrale.runner import RunRequest, run
from metrale.runtime import runtime_config
url, count, cap, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) or None, Path(sys.argv[4])
runtime = runtime_config(sys.argv[5]) if sys.argv[5] != "none" else None
start = time.perf_counter()
outcome = asyncio.run(run(RunRequest(
    benchmark="gsm8k", params={"rollouts": count, "max_concurrent": cap, "max_tokens": 4},
    target=Target(base_url=url, model="metrale-sim"), out=out, preflight=False, progress=None,
    runtime=runtime)))
print(json.dumps({"rollouts": count, "max_concurrent": cap,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "e2e_s": time.perf_counter() - start,
                  "errors": outcome.result.metrics["errors"]}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="1000,10000,100000")
    ap.add_argument("--max-concurrent", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=0, help="rollouts all in flight (0: skip)")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds the sim holds an answer")
    ap.add_argument("--runtime", default="none", help="for --in-flight: none or bwrap")
    args = ap.parse_args()
    with sim("--output-tokens", "4") as url:
        for count in (int(c) for c in args.counts.split(",") if c):
            print(json.dumps(child(url, count, args.max_concurrent, "none")), flush=True)
    if args.in_flight:
        with sim("--output-tokens", "4", "--ttft", str(args.hold)) as url:
            low = child(url, args.in_flight, args.max_concurrent, args.runtime)
            high = child(url, args.in_flight, 0, args.runtime)
        for row in (low, high):
            print(json.dumps(row), flush=True)
        per = (
            (high["peak_rss_mb"] - low["peak_rss_mb"])
            * 1024
            / (args.in_flight - args.max_concurrent)
        )
        print(f"metrale's RSS per rollout in flight ({args.runtime}): {per:.1f} KiB "
              f"({args.in_flight} vs {args.max_concurrent} in flight)")  # fmt: skip
    print(machine())
    return 0


def child(url: str, count: int, cap: int, runtime: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, url, str(count), str(cap), f"{tmp}/run", runtime],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    raise SystemExit(main())
