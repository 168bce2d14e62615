"""What a command in a live bwrap sandbox costs today, against a shell inside that forks it.

Issue 27's bwrap cell is CPU-bound, and its grader is one command a rollout. This measures the
route docs/measurements.md names for it ("a process inside each sandbox that forks commands on
request") before anyone builds it: the machine's busy CPU (`/proc/stat`) per command over
`--commands` sequential runs of the gsm8k grader's `awk`, in one sandbox each way:

- **metrale**: `BwrapRuntime.run(argv)` as every rollout's command runs now: a spawner thread
  starts the gate's `sh`, which is moved into the sandbox's cgroups and execs `nsenter`, which
  enters the namespaces and execs `env -i`, which execs `awk`; pipes and the exit are read on
  the event loop.
- **shell inside**: the same sandbox and entry, but entered once: a `sh` inside reads one
  command a line on its stdin, runs it in a subshell (fork, then the command's exec) and
  answers `done <exit>`; a command is a write and two reads of a pipe. This is a prototype of
  the measurement only: it has none of what a real command needs (its own environment,
  stdin, output caps, timeouts, kill), so it bounds the saving from above.

Usage: python benchmarks/bwrap_command_cost.py [--commands 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _harness import machine
from bwrap_cpu import busy_ticks, ticks_s

from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.bwrap import BwrapRuntime
from metrale.runtime.bwrap_setup import GO
from metrale.runtime.sandbox_proc import close_all

GRADER = 'BEGIN { if ("42" + 0 == 42) print 1; else print 0 }'
SERVER = 'while IFS= read -r line; do ( eval "$line" ) </dev/null; echo "done $?"; done'


async def through_metrale(n: int) -> float:
    async with create_runtime(runtime_config("bwrap")) as rt:
        await rt.run(["awk", GRADER])  # warm
        before = busy_ticks()
        for _ in range(n):
            result = await rt.run(["awk", GRADER], timeout=30)
            assert result.stdout == "1\n", result
        return ticks_s(busy_ticks() - before) / n * 1e3


async def through_a_shell_inside(n: int) -> float:
    async with create_runtime(runtime_config("bwrap")) as rt:
        assert isinstance(rt, BwrapRuntime)
        argv, fds = rt._enter(["sh", "-c", SERVER], None, rt._env(None), stdin=True)
        shell = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            pass_fds=fds, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert shell.stdin is not None and shell.stdout is not None
        line = f"awk '{GRADER}'\n".encode()

        async def one() -> None:
            assert shell.stdin is not None and shell.stdout is not None
            shell.stdin.write(line)
            await shell.stdin.drain()
            out, done = await shell.stdout.readline(), await shell.stdout.readline()
            assert (out, done) == (b"1\n", b"done 0\n"), (out, done)

        try:
            shell.stdin.write(GO)  # the gate's line (no cgroup move here: not the cost asked)
            await one()  # warm
            before = busy_ticks()
            for _ in range(n):
                await one()
            return ticks_s(busy_ticks() - before) / n * 1e3
        finally:
            shell.stdin.close()
            await shell.wait()
            close_all(fds)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    now, inside = [], []
    for r in range(args.repeats):
        now.append(await through_metrale(args.commands))
        inside.append(await through_a_shell_inside(args.commands))
        print(f"repeat {r + 1}: metrale {now[-1]:.2f} ms, shell inside {inside[-1]:.2f} ms")
    print(
        f"\nmachine CPU per command, {args.commands} sequential awk graders, median of "
        f"{args.repeats} interleaved repeats from {started}: metrale "
        f"{statistics.median(now):.2f} ms, shell inside {statistics.median(inside):.2f} ms, "
        f"difference {statistics.median(now) - statistics.median(inside):.2f} ms"
    )
    print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
