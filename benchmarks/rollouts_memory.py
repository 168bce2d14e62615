"""Peak memory of `metrale run gsm8k` by rollout count at a fixed concurrency, against the sim.

Each count runs in a fresh process (`ru_maxrss` is a process's peak), 64 rollouts in flight,
the sim answering at once with 4 tokens. With a bounded worker pool and no record kept in
memory beyond per-stage durations, the peak should grow by only ~8 bytes x 4 per rollout.

    python benchmarks/rollouts_memory.py --counts 1000,10000,100000 --max-concurrent 64
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
url, count, cap, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
start = time.perf_counter()
outcome = asyncio.run(run(RunRequest(
    benchmark="gsm8k", params={"rollouts": count, "max_concurrent": cap, "max_tokens": 4},
    target=Target(base_url=url, model="metrale-sim"), out=out, preflight=False, progress=None)))
print(json.dumps({"rollouts": count, "max_concurrent": cap,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "e2e_s": time.perf_counter() - start,
                  "errors": outcome.result.metrics["errors"]}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="1000,10000,100000")
    ap.add_argument("--max-concurrent", type=int, default=64)
    args = ap.parse_args()
    with sim("--output-tokens", "4") as url:
        for count in (int(c) for c in args.counts.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run(
                    [sys.executable, "-c", CHILD, url, str(count), str(args.max_concurrent),
                     f"{tmp}/run"],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
            print(json.dumps(json.loads(proc.stdout.strip().splitlines()[-1])), flush=True)
    print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
