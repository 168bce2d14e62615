"""What a command in a live bwrap sandbox costs metrale, against the bare minimum: the same
program forked by a shell loop inside the sandbox.

Issue 27's bwrap cell is CPU-bound, and its grader is one command a rollout. This counts the
machine's busy CPU (`/proc/stat`) per command over `--commands` sequential runs of the gsm8k
grader's `awk`, in one sandbox each way:

- **metrale**: `BwrapRuntime.run(argv)` as every rollout's command runs: a script to the
  sandbox's executor, which forks it (`runtime/bwrap_exec.py`); FIFOs for its output, its
  answers read on the event loop.
- **a loop inside**: one command that runs the same `awk` `--commands` times in a `sh` loop:
  a fork and an exec each, nothing else, which any route must still pay.

With `--before SRC` (another tree's `src`, e.g. `git archive` of an older commit), each
repeat also runs the metrale route of that tree, in a process of its own.

Usage: python benchmarks/bwrap_command_cost.py [--commands 300] [--repeats 3] [--before SRC]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import time

from _harness import machine
from bwrap_cpu import busy_ticks, ticks_s

from metrale.runtime import create_runtime, runtime_config

GRADER = 'BEGIN { if ("42" + 0 == 42) print 1; else print 0 }'


async def through_metrale(n: int) -> float:
    async with create_runtime(runtime_config("bwrap")) as rt:
        await rt.run(["awk", GRADER])  # warm
        before = busy_ticks()
        for _ in range(n):
            result = await rt.run(["awk", GRADER], timeout=30)
            assert result.stdout == "1\n", result
        return ticks_s(busy_ticks() - before) / n * 1e3


async def in_a_loop_inside(n: int) -> float:
    loop = f"i=0; while [ $i -lt {n} ]; do awk {shlex.quote(GRADER)}; i=$((i+1)); done"
    async with create_runtime(runtime_config("bwrap")) as rt:
        await rt.run(["awk", GRADER])  # warm
        before = busy_ticks()
        result = await rt.run(["sh", "-c", loop], timeout=600)
        assert result.stdout == "1\n" * n, result.stderr
        return ticks_s(busy_ticks() - before) / n * 1e3


def through_tree(src: str, n: int) -> float:
    """`through_metrale` run by the metrale of tree `src`, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": src}
    code = (
        "import asyncio, sys; sys.path.insert(0, sys.argv[1]); import bwrap_command_cost as b; "
        "print(asyncio.run(b.through_metrale(int(sys.argv[2]))))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", code, here, str(n)], env=env, check=True, capture_output=True
    )
    return float(out.stdout.decode().split()[-1])


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", metavar="SRC", help="another tree's src, measured beside")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    now, inside, before = [], [], []
    for r in range(args.repeats):
        if args.before:
            before.append(through_tree(args.before, args.commands))
        now.append(await through_metrale(args.commands))
        inside.append(await in_a_loop_inside(args.commands))
        was = f"before {before[-1]:.2f} ms, " if before else ""
        print(f"repeat {r + 1}: {was}metrale {now[-1]:.2f} ms, loop inside {inside[-1]:.2f} ms")
    was = f"before {statistics.median(before):.2f} ms, " if before else ""
    print(
        f"\nmachine CPU per command, {args.commands} sequential awk graders, median of "
        f"{args.repeats} interleaved repeats from {started}: {was}metrale "
        f"{statistics.median(now):.2f} ms, a loop inside {statistics.median(inside):.2f} ms, "
        f"difference {statistics.median(now) - statistics.median(inside):.2f} ms"
    )
    print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
