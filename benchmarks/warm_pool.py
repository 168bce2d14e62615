"""What `--runtime-pool N` buys, and what it hides: gsm8k in bwrap at a bounded concurrency,
with and without a warm pool, interleaved in the same minutes against one `metrale sim`.

Per cell: e2e, the rollouts' setup p50 (what they waited for), the pool's own start p50
(`pool_start`: the cost moved off their path, not removed) and the whole process's CPU
seconds (user + sys of metrale and everything it ran: the pool does not make starts cheaper).

    python benchmarks/warm_pool.py --rollouts 256 --max-concurrent 8 --pool 16 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim


def cell(url: str, args: argparse.Namespace, pool: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
                "--model", "metrale-sim", "--runtime", "bwrap", "--rollouts", str(args.rollouts),
                "--max-concurrent", str(args.max_concurrent), "--runtime-pool", str(pool),
                "--max-tokens", "16", "--no-preflight", "--quiet", "--out", str(out)]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        metrics = json.loads((out / "result.json").read_text())["result"]["metrics"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "e2e_s": metrics["e2e_s"],
        "setup": metrics["setup"],
        "pool_start": metrics.get("pool_start") or 0.0,
        "total": metrics["total"],
        "errors": metrics["errors"],
        "cpu_s": cpu,
        "process_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--max-concurrent", type=int, default=8)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.2)
    args = ap.parse_args()
    rows: dict[int, list[dict[str, float]]] = {0: [], args.pool: []}
    with sim("--ttft", str(args.latency), "--output-tokens", "16") as url:
        for i in range(args.repeats):
            for pool in rows:  # interleaved: both see the same machine
                row = cell(url, args, pool)
                rows[pool].append(row)
                shown = {k: round(v, 4) for k, v in row.items()}
                print(f"repeat {i} pool {pool}: {json.dumps(shown)}", flush=True)
    for pool, got in rows.items():
        med = {k: round(statistics.median(r[k] for r in got), 4) for k in got[0]}
        print(f"median pool {pool}: {json.dumps(med)}")
    base = statistics.median(r["e2e_s"] for r in rows[0])
    pooled = statistics.median(r["e2e_s"] for r in rows[args.pool])
    print(f"e2e pool {args.pool} / no pool: {pooled / base:.3f}")
    print(f"{args.rollouts} rollouts, --max-concurrent {args.max_concurrent}, "
          f"endpoint {args.latency} s; {machine()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
