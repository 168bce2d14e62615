"""gsm8k x512 in bwrap, unbounded, against this machine's floor measured in the same run.

Each repeat, side by side, in one process tree:

- **floor**: N bare `bwrap ... true` started at once (the namespaces and binds any sandbox
  needs, nothing of metrale's), wall clock from the first spawn to the last exit;
- **metrale**: `metrale run gsm8k --runtime bwrap --rollouts N` (no `--max-concurrent`)
  against `metrale sim` answering in `--latency` s, in its own process; e2e, the stage p50s
  (setup_wait, setup, generation, scoring, stop) from its result.json, and the bwrap processes
  still alive 1 s after it exited (must be 0).

Target (issue 14): metrale's e2e <= 2 x (floor + latency), scoring p50 <= 100 ms, generation
p50 within 20% of the latency, 0 errors, no bwrap alive 1 s after exit. Medians are quoted.

    python benchmarks/bwrap_scale.py --rollouts 512 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim

FLOOR_BINDS = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
for _d in ("/bin", "/lib", "/lib64", "/sbin"):
    if os.path.exists(_d):
        FLOOR_BINDS += ["--ro-bind", _d, _d]


async def floor(n: int) -> float:
    """Seconds for `n` bare `bwrap ... true` started at once, all exited."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", *FLOOR_BINDS, "--die-with-parent", "true"]
    started = time.perf_counter()
    procs = await asyncio.gather(
        *(asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL) for _ in range(n))
    )
    codes = await asyncio.gather(*(p.wait() for p in procs))
    took = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"bare bwrap failed in {sum(1 for c in codes if c)} of {n}")
    return took


def bwraps_alive() -> int:
    """bwrap processes on this machine now (the floor's are all reaped before metrale runs)."""
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap":
                    count += 1
            except OSError:
                pass
    return count


def metrale_cell(url: str, n: int, extra: list[str]) -> dict[str, float | int | None]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
                "--model", "metrale-sim", "--runtime", "bwrap", "--rollouts", str(n),
                "--max-tokens", "16", "--no-preflight", "--out", str(out), *extra]  # fmt: skip
        before = bwraps_alive()
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        process_s = time.perf_counter() - started
        time.sleep(1.0)
        alive = max(0, bwraps_alive() - before)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
        result = json.loads((out / "result.json").read_text())["result"]
    metrics = result["metrics"]
    row: dict[str, float | int | None] = {
        "e2e_s": metrics["e2e_s"],
        "process_s": process_s,
        "errors": metrics["errors"],
        "alive_1s_after_exit": alive,
        "exit": proc.returncode,
    }
    for stage in ("setup_wait", "setup", "generation", "scoring", "stop", "total"):
        row[stage] = metrics.get(stage)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--extra", default="", help="more flags for metrale run, space separated")
    args = ap.parse_args()
    rows = []
    with sim("--ttft", str(args.latency), "--output-tokens", "16") as url:
        for i in range(args.repeats):
            floor_s = asyncio.run(floor(args.rollouts))
            row = {"floor_s": floor_s, **metrale_cell(url, args.rollouts, args.extra.split())}
            row["ratio"] = row["e2e_s"] / (floor_s + args.latency)  # type: ignore[operator]
            rows.append(row)
            print(f"repeat {i}: " + json.dumps({k: _r(v) for k, v in row.items()}), flush=True)
    keys = [k for k in rows[0] if all(isinstance(r[k], int | float) for r in rows)]
    med = {k: _r(statistics.median(float(r[k]) for r in rows)) for k in keys}  # type: ignore[arg-type]
    print("median: " + json.dumps(med))
    print(f"target: e2e <= 2 x (floor + {args.latency}) -> ratio {med['ratio']} (<= 2)")
    print(machine() + f", load {os.getloadavg()[0]:.1f}")
    return 0


def _r(x: object) -> object:
    return round(x, 3) if isinstance(x, float) else x


if __name__ == "__main__":
    raise SystemExit(main())
