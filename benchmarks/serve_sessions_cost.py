"""Session load's own cost: scheduling lag at 1,000 concurrent sessions, and memory per session.

1. **Lag.** `metrale run serve --load sessions --lanes 1000` against a `metrale sim` (TTFT 50 ms,
   then 16 tokens in one write), synthetic sessions with exponential tool time, so the 1,000
   sessions are in flight at once and each turn is sent after a sleep. Its scheduling lag
   (send − ready, `sched_lag_ms_p99`) is set beside its **floor**: a bare asyncio loop in its own
   process with 1,000 tasks on the same schedule (lanes started over a ramp as long as
   the mean tool time, `--ramp-s`; then the tool-time draws, 50 ms an answer), each measuring
   how late it woke: what any asyncio client on this machine can do at best while it sends
   nothing. Runs are interleaved, repeated, and the medians quoted.
   Beside each run: the cores metrale and the simulator kept busy (CPU seconds over the run's
   wall time), to tell the client's own cost from the two cores' sharing.
2. **Memory per session.** The peak RSS of the same run at 1,000 lanes and at 10 lanes (its own
   process each, `os.wait4`): (RSS₁₀₀₀ − RSS₁₀) / 990 is what one session in flight costs,
   beside the size of one session's messages (`sys.getsizeof` over everything it holds).

Usage: python benchmarks/serve_sessions_cost.py [--repeats 3] [--lanes 1000] [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim

FLOOR = r"""
import asyncio, random, sys, time
lanes, turns, mean = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
lags = []
async def lane(seed):
    rng = random.Random(seed)
    await asyncio.sleep(mean * seed / lanes)  # the same ramp as --ramp-s MEAN
    for turn in range(turns):  # metrale's schedule: turn 1 at the lane's start, then tool time
        ready = time.perf_counter() + (rng.expovariate(1 / mean) if turn else 0.0)
        await asyncio.sleep(max(ready - time.perf_counter(), 0))
        lags.append(time.perf_counter() - ready)
        await asyncio.sleep(0.05)  # the turn's answer: the sim's 50 ms TTFT
async def main():
    await asyncio.gather(*(lane(i) for i in range(lanes)))
asyncio.run(main())
lags.sort()
print(lags[int(0.99 * (len(lags) - 1))] * 1000, lags[len(lags) // 2] * 1000)
"""


def sim_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this script's `metrale sim` child."""
    ticks = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and b"sim" in cmdline:
            return (int(fields[11]) + int(fields[12])) / ticks
    return float("nan")


def maxrss_run(cmd: list[str], timeout: float) -> tuple[int, float, float, float, float]:
    """Run `cmd`; return (exit code, its peak RSS in MiB, its CPU seconds, its wall seconds,
    the sim's CPU seconds meanwhile)."""
    sim_before = sim_cpu_s()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            cpu = usage.ru_utime + usage.ru_stime
            wall = time.monotonic() - start
            code = os.waitstatus_to_exitcode(status)
            return code, usage.ru_maxrss / 1024, cpu, wall, sim_cpu_s() - sim_before
        if time.monotonic() - start > timeout:
            proc.kill()
            raise RuntimeError(f"timed out: {' '.join(cmd[:6])}")
        time.sleep(0.05)


def run_sessions(url: str, lanes: int, turns: int, tool_mean: float, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--no-preflight",
        "--load", "sessions", "--lanes", str(lanes), "--sessions", str(lanes), "--turns",
        str(turns), "--turn-tokens", "50", "--system-tokens", "200",
        "--tool-time", f"exp:{tool_mean}", "--max-tokens", "16", "--out", str(out), "--quiet",
        "--ramp-s", str(tool_mean),
    ]  # fmt: skip
    code, rss, cpu, wall, sim_cpu = maxrss_run(cmd, timeout=600)
    if code != 0 or not (out / "result.json").is_file():
        raise RuntimeError(f"metrale exited {code}")
    m = json.loads((out / "result.json").read_text())["result"]["metrics"]
    return {"lag_p99": m["sched_lag_ms_p99"], "lag_p50": m["sched_lag_ms_p50"], "rss": rss,
            "requests": m["requests"], "errors": m["errors"], "cpu": cpu / wall,
            "sim_cpu": sim_cpu / wall}  # fmt: skip


def run_floor(lanes: int, turns: int, tool_mean: float) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", FLOOR, str(lanes), str(turns), str(tool_mean)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    p99, p50 = (float(x) for x in out.stdout.split())
    return p99, p50


def session_bytes(turns: int) -> int:
    from metrale.benchmarks.serve.sessions import SyntheticSessions, ToolTime

    s = SyntheticSessions(turns, 50, 200, ToolTime.parse("exp:1")).session(0)
    seen: set[int] = set()

    def size(o: object) -> int:
        if id(o) in seen:
            return 0
        seen.add(id(o))
        n = sys.getsizeof(o)
        if isinstance(o, dict):
            n += sum(size(k) + size(v) for k, v in o.items())
        elif isinstance(o, list | tuple):
            n += sum(size(x) for x in o)
        elif hasattr(o, "__slots__"):
            n += sum(size(getattr(o, a)) for a in o.__slots__)
        return n

    return size(s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lanes", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--tool-mean", type=float, default=2.0)
    a = ap.parse_args()
    rows, floors, small = [], [], []
    with sim("--ttft", "0.05", "--output-tokens", "16") as url, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        for i in range(a.repeats):
            rows.append(run_sessions(url, a.lanes, a.turns, a.tool_mean, Path(tmp) / f"big{i}"))
            floors.append(run_floor(a.lanes, a.turns, a.tool_mean))
            small.append(run_sessions(url, 10, a.turns, a.tool_mean, Path(tmp) / f"small{i}"))
            print(f"repeat {i}: metrale lag p99 {rows[-1]['lag_p99']:.2f} ms "
                  f"(p50 {rows[-1]['lag_p50']:.3f}), floor p99 {floors[-1][0]:.2f} ms "
                  f"(p50 {floors[-1][1]:.3f}); RSS {rows[-1]['rss']:.0f} MiB at {a.lanes} "
                  f"lanes, {small[-1]['rss']:.0f} MiB at 10; requests {rows[-1]['requests']}, "
                  f"errors {rows[-1]['errors']}; cores busy: metrale {rows[-1]['cpu']:.2f}, "
                  f"sim {rows[-1]['sim_cpu']:.2f}; load {os.getloadavg()[0]:.2f}",
                  flush=True)  # fmt: skip
    med = statistics.median
    per_session = (med(r["rss"] for r in rows) - med(r["rss"] for r in small)) / (a.lanes - 10)
    print(f"\n{a.lanes} concurrent sessions x {a.turns} turns, tool time exp:{a.tool_mean}, "
          f"medians of {a.repeats}:")  # fmt: skip
    print(
        f"  scheduling lag p99: metrale {med(r['lag_p99'] for r in rows):.2f} ms, "
        f"asyncio floor {med(f[0] for f in floors):.2f} ms (target < 5 ms)"
    )
    print(
        f"  peak RSS: {med(r['rss'] for r in rows):.0f} MiB at {a.lanes} lanes, "
        f"{med(r['rss'] for r in small):.0f} MiB at 10: {per_session * 1024:.0f} KiB a session"
    )
    print(f"  one session's messages at its last turn: {session_bytes(a.turns) / 1024:.1f} KiB")
    print(machine())


if __name__ == "__main__":
    main()
