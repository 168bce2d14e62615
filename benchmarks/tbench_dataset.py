"""The shipped terminal_bench tasks as a dataset: every task K attempts, one agent, one runtime,
through the real command line; prints the run's wall clock, its images (built or reused), the
load average before and after, and its per-task table (from the run's summary.json) as
Markdown, for docs/benchmarks/terminal_bench.md.

    python benchmarks/tbench_dataset.py --agent oracle --runtime docker --attempts 8

Needs the engine of scripts/container-engine.sh (run it under the engine lock: one agent and
runtime per call keeps each piece to a few minutes). The wall clock covers the whole process:
the image builds of a first run (or, for bwrap, the roots' export) and the rollouts (e2e).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from metrale.benchmarks.terminal_bench.task import shipped_tasks_dir
from metrale.plugin.per_task import TaskSummary, dataset_line, per_task_table
from metrale.table import render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="oracle", choices=["oracle", "nop"])
    parser.add_argument("--runtime", default="docker")
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--max-concurrent", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "metrale", "run", "terminal_bench",
                "-p", f"task={shipped_tasks_dir()}", "-p", f"agent={args.agent}",
                "--attempts", str(args.attempts), "--max-concurrent", str(args.max_concurrent),
                "--runtime", args.runtime, "--out", str(out), "--quiet"]  # fmt: skip
        load_before = os.getloadavg()
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        load_after = os.getloadavg()
        if not (out / "summary.json").is_file():
            sys.exit(f"the run failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
        summary = json.loads((out / "summary.json").read_text())
    tasks = [TaskSummary.model_validate(t) for t in summary["per_task"]]
    m = summary["metrics"]
    images = m.get("images", 1)
    cached = m.get("image_cached", 0)
    print(f"{args.agent} on {args.runtime}, {args.attempts} attempts, max_concurrent "
          f"{args.max_concurrent}: wall clock {wall:.1f} s (process), e2e "
          f"{summary['e2e_s']:.1f} s (rollouts), exit {done.returncode}")  # fmt: skip
    print(f"images: {images}, {cached} reused, builds {m.get('image_build_s') or 0:.1f} s; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")  # fmt: skip
    print(dataset_line(tasks, args.attempts))
    print()
    print(render(*per_task_table(tasks, args.attempts), style="markdown"))


if __name__ == "__main__":
    main()
