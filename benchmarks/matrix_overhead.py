"""What `metrale matrix` costs per cell beyond the cell's own run (issue #5: <= 50 ms).

A sweep of small gsm8k cells runs against `metrale sim` (its own process, no delay). For each
cell, its slice of the sweep is the time from the end of the previous cell's line (or the
sweep's start) to the end of its own line; the runner's `e2e_s` is the cell's run. So

    overhead per cell = slice − e2e_s

which counts everything the sweep does around a run: building the request, the runner's own
set-up outside e2e (finding the benchmark, the run directory, run.json), reading
rollouts.jsonl back, summarising, writing the cell file atomically and printing its line.
The sweep-level figure, (sweep wall − Σ e2e_s) / cells, is printed as a cross-check.

    python benchmarks/matrix_overhead.py --repeats 3

Cells: rollouts 4, 8, 16, 32 x max_concurrent none, 1, 2, 4, 8 = 20 cells, runtime none.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from _harness import machine, sim

from metrale.endpoint.client import Target
from metrale.matrix.execute import plan_sweep, run_sweep
from metrale.matrix.sweep import Sweep


class StampedLines(io.StringIO):
    """A report stream that notes when each cell's line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def write(self, text: str) -> int:
        n = super().write(text)
        if text.endswith("\n"):
            self.stamps.append(time.perf_counter())
        return n


async def one_sweep(url: str, out: Path, runtime: str) -> tuple[list[float], float, float]:
    sweep = Sweep(
        benchmark="gsm8k",
        out=out,
        runtimes=[runtime],
        rollouts=[4, 8, 16, 32],
        max_concurrent=[None, 1, 2, 4, 8],
        params={"max_tokens": [16]},
    )
    plan = plan_sweep(sweep)
    lines = StampedLines()
    started = time.perf_counter()
    results = await run_sweep(
        plan,
        {"default": Target(base_url=url, model="metrale-sim")},
        preflight=False,
        progress=None,
        report=lines,
    )
    wall = time.perf_counter() - started
    edges = [started, *lines.stamps]
    slices = [b - a for a, b in itertools.pairwise(edges)]
    overheads = [s - (r.e2e_s or 0.0) for s, r in zip(slices, results, strict=True)]
    return overheads, wall, sum(r.e2e_s or 0.0 for r in results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runtime", default="none", help="runtime axis value of every cell")
    args = ap.parse_args()
    with sim() as url:
        medians, sweep_level = [], []
        for i in range(args.repeats + 1):  # the first sweep warms caches and is not counted
            with tempfile.TemporaryDirectory() as tmp:
                overheads, wall, e2e = asyncio.run(one_sweep(url, Path(tmp) / "out", args.runtime))
            n = len(overheads)
            med = statistics.median(overheads)
            label = "warm-up" if i == 0 else f"sweep {i}"
            print(
                f"{label}: {n} cells, wall {wall:.3f} s, sum e2e {e2e:.3f} s; overhead per cell "
                f"median {med * 1e3:.1f} ms, max {max(overheads) * 1e3:.1f} ms, "
                f"sweep-level {(wall - e2e) / n * 1e3:.1f} ms"
            )
            if i:
                medians.append(med)
                sweep_level.append((wall - e2e) / n)
        print(
            f"median per-cell overhead: {statistics.median(medians) * 1e3:.1f} ms "
            f"(sweep-level {statistics.median(sweep_level) * 1e3:.1f} ms; goal <= 50 ms)"
        )
        print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
