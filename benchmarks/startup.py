"""Start-up to the first request: `metrale run gsm8k --target URL` from process start to its
first rollout's chat call, against a `metrale sim` already running.

Each repeat runs `metrale run gsm8k --rollouts 1 --max-tokens 16 --quiet` in its own process
(`--no-preflight` unless `--preflight`: the preflight runs beside the first rollouts, not before
them) and reads the earliest generation start in its records, by the wall clock both processes
share: start-up = that start - the time just before the process was spawned. The process's own
CPU seconds (user + system, from `wait4`) are printed beside it: the figure to iterate on where
other work shares the cores.

The tree's modules are byte-compiled first (`compileall`), as an installed package is: with
`PYTHONDONTWRITEBYTECODE` set, every run would otherwise compile metrale's sources again.

Target (issue 27): <= 250 ms (median).

    python benchmarks/startup.py --repeats 10 [--runtime bwrap] [--src DIR]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim


def one_start(url: str, src: str, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
                "--model", "metrale-sim", "--rollouts", "1", "--max-tokens", "16", "--quiet",
                "--out", str(out), *extra]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": src}
        wall0 = time.time()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
        process_s = time.time() - wall0
        if proc.returncode != 0:
            raise SystemExit(f"metrale failed: {stderr.decode(errors='replace')[-1000:]}")
        first_call = min(
            json.loads(line)["stages"]["generation"]["started_at"]
            for line in (out / "rollouts.jsonl").read_text().splitlines()
        )
    return {
        "startup_s": first_call - wall0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "process_s": process_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--runtime", help="--runtime for metrale run (default: none)")
    ap.add_argument("--preflight", action="store_true", help="metrale runs its 2+2 preflight")
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"),
                    help="the source tree to run (default: this checkout's src)")  # fmt: skip
    args = ap.parse_args()
    compileall.compile_dir(args.src, quiet=1)
    extra = [] if args.preflight else ["--no-preflight"]
    if args.runtime:
        extra += ["--runtime", args.runtime]
    rows = []
    with sim("--ttft", "0.01", "--output-tokens", "16") as url:
        one_start(url, args.src, extra)  # warm the disk cache and the sim
        for i in range(args.repeats):
            row = one_start(url, args.src, extra)
            rows.append(row)
            print(f"run {i}: " + json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    print("median: " + json.dumps(med))
    print(f"target: start-up {med['startup_s'] * 1000:.0f} ms (<= 250 ms)")
    print(machine() + f", load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
