"""Where the bwrap cell's CPU goes, per rollout, against the floor's per sandbox.

On two cores the cell cannot end sooner than its CPU allows, so this counts CPU, the figure
noise hurts least. Each repeat runs, one after the other:

- **floor**: `bwrap_scale.floor(N)` (issue 27's N bare `bwrap ... true` at once);
- **each tree** given (`--tree LABEL=SRC`, default: this checkout's `src`):
  `metrale run gsm8k --runtime bwrap --rollouts N` (unbounded) against `metrale sim`, the
  trees' order turned by one each repeat (a run pays for the run before it: see `main`).

For each it reports the machine's busy CPU over the run (`/proc/stat`: user, nice, system, irq,
softirq; idle, iowait and steal left out), per rollout (floor: per sandbox), and for metrale
its own process's CPU with its reaped descendants (`wait4`). With `--perf`, the run is also
sampled system-wide (`perf record -a`) and the busy CPU is split by program (`comm`: `bwrap`,
`setpriv`, `sh`, `nsenter`, `env`, `awk`, `cat`, ...; metrale's main thread apart from its
other threads), in ms per rollout. A tree is any source tree, so a bound's cost is measured
by pointing one at a copy with that bound turned off (the ablation in docs/measurements.md).

    python benchmarks/bwrap_cpu.py --rollouts 512 --repeats 2 [--perf] [--tree off=/tmp/x/src]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim
from bwrap_scale import floor

HERE_SRC = str(Path(__file__).resolve().parent.parent / "src")


def busy_ticks() -> int:
    """The machine's busy clock ticks so far (all CPUs)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return user + nice + system + irq + softirq


def ticks_s(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")


def run_floor(n: int) -> dict[str, float]:
    before = busy_ticks()
    wall = floor(n)
    return {"wall_s": wall, "machine_ms_each": ticks_s(busy_ticks() - before) / n * 1e3}


def run_cell(url: str, n: int, src: str, perf: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
                "--model", "metrale-sim", "--runtime", "bwrap", "--rollouts", str(n),
                "--max-tokens", "16", "--no-preflight", "--quiet",
                "--out", f"{tmp}/run"]  # fmt: skip
        data = f"{tmp}/perf.data"
        if perf:
            argv = ["perf", "record", "-q", "-a", "-F", "999", "-o", data, "--", *argv]
        env = {**os.environ, "PYTHONPATH": src}
        load = os.getloadavg()[0]
        before = busy_ticks()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        busy = ticks_s(busy_ticks() - before)
        if proc.returncode != 0:
            print(stderr.decode(errors="replace")[-2000:], file=sys.stderr)
        metrics = json.loads(Path(f"{tmp}/run/result.json").read_text())["result"]["metrics"]
        row: dict[str, object] = {
            "e2e_s": metrics["e2e_s"],
            "errors": metrics["errors"],
            "machine_ms_each": busy / n * 1e3,
            "metrale_tree_ms_each": (usage.ru_utime + usage.ru_stime) / n * 1e3,
            "load": load,
        }
        if perf:
            row["by_program_ms_each"] = by_program(data, n)
    return row


def by_program(data: str, n: int) -> dict[str, float]:
    """Samples of `perf record -a -F 999` by program, in ms of CPU per rollout; metrale's
    threads are `python` (its main thread: `metrale loop`; the simulator is one more python)."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = []
    for line in out.splitlines():
        parts = line.rsplit(None, 1)
        if len(parts) == 2 and "/" in parts[1]:
            rows.append((parts[0].strip(), *parts[1].split("/", 1)))
    # metrale is the python process with the most threads sampled; the other is the sim
    threads: dict[str, set[str]] = collections.defaultdict(set)
    for comm, pid, tid in rows:
        if comm == "python":
            threads[pid].add(tid)
    metrale = max(threads, key=lambda p: len(threads[p])) if threads else ""
    counts: collections.Counter[str] = collections.Counter()
    for comm, pid, tid in rows:
        if comm == "swapper":  # idle
            continue
        if comm == "python":
            comm = "sim (python)" if pid != metrale else (
                "metrale loop" if tid == pid else "metrale threads")  # fmt: skip
        counts[comm] += 1
    return {k: round(v / 999 / n * 1e3, 2) for k, v in counts.most_common(16)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--perf", action="store_true", help="split the CPU by program (perf)")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=SRC",
                    help="a source tree to run (repeatable; default: this checkout)")  # fmt: skip
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"now": HERE_SRC}
    n = args.rollouts
    rows: dict[str, list[dict[str, object]]] = collections.defaultdict(list)
    with sim("--ttft", str(args.latency), "--output-tokens", "16") as url:
        for i in range(args.repeats):
            fl = run_floor(n)
            rows["floor"].append(fl)
            print(f"repeat {i} floor: {json.dumps(_round(fl))}", flush=True)
            # the trees' order turns each repeat: on an ext4 without a journal a run pays for
            # the workdirs the run before it deleted (~0.6 ms a rollout, measured), so a tree
            # always second would always pay
            order = list(trees.items())
            k = i % len(order)
            for label, src in order[k:] + order[:k]:
                time.sleep(1.0)
                row = run_cell(url, n, src, args.perf)
                rows[label].append(row)
                print(f"repeat {i} {label}: {json.dumps(_round(row))}", flush=True)
    for label, cell in rows.items():
        keys = [k for k, v in cell[0].items() if isinstance(v, int | float)]
        med = {k: statistics.median(float(r[k]) for r in cell) for k in keys}  # type: ignore[arg-type]
        print(f"median {label} (n={n}): {json.dumps(_round(med))}")
    print(machine() + f", load {os.getloadavg()[0]:.1f}")
    return 0


def _round(row: dict[str, object]) -> dict[str, object]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


if __name__ == "__main__":
    raise SystemExit(main())
