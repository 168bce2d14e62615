"""Harness overhead of `metrale run gsm8k` against `metrale sim` with a fixed 1 s latency.

The simulator (its own process) answers every call after exactly 1 s with 16 tokens, so any
e2e beyond 1 s is metrale's own cost: issuing 1,024 concurrent calls, parsing their streams,
scoring, and writing 1,024 records. Overhead per rollout = (e2e − 1 s) / rollouts.

    python benchmarks/gsm8k_overhead.py --rollouts 1024 --repeats 5

Prints each repeat and the medians; goal (issue #2): e2e <= 1.5 s, scoring p50 <= 5 ms.
`cpu_ms_per_rollout` is metrale's own CPU time (process time, all threads) per rollout: on a
shared, noisy machine it is the steadier figure, since wall-clock overhead also counts the time
other processes held the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import TextIO

from _harness import machine, sim

from metrale.endpoint.client import Target
from metrale.runner import RunRequest, run


class _Terminal:
    """A stream that says it is a terminal, so the runner draws the rich view into it."""

    def __init__(self, sink: TextIO) -> None:
        self.sink = sink

    def write(self, text: str) -> int:
        return self.sink.write(text)

    def flush(self) -> None:
        self.sink.flush()

    def isatty(self) -> bool:
        return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument(
        "--live",
        action="store_true",
        help="draw the rich live view (into /dev/null, as if it were a terminal) to measure "
        "what it costs; default: no view",
    )
    args = ap.parse_args()
    sink = open(os.devnull, "w", encoding="utf-8") if args.live else None  # noqa: SIM115
    with sim("--ttft", str(args.latency), "--output-tokens", "16") as url:
        rows = []
        for i in range(args.repeats + 1):  # the first run warms caches and is not counted
            with tempfile.TemporaryDirectory() as tmp:
                request = RunRequest(
                    benchmark="gsm8k",
                    params={"rollouts": args.rollouts, "max_tokens": 16},
                    target=Target(base_url=url, model="metrale-sim"),
                    out=Path(tmp) / "run",
                    preflight=False,
                    progress=_Terminal(sink) if sink is not None else None,
                )
                cpu0 = time.process_time()
                outcome = asyncio.run(run(request))
                cpu_s = time.process_time() - cpu0
            m, stages = outcome.result.metrics, outcome.result.stages
            row = {
                "e2e_s": m["e2e_s"],
                "overhead_ms_per_rollout": (m["e2e_s"] - args.latency) / args.rollouts * 1e3,
                "cpu_ms_per_rollout": cpu_s / args.rollouts * 1e3,
                "generation_p50_s": stages["generation"].p50,
                "scoring_p50_ms": stages["scoring"].p50 * 1e3,
                "errors": m["errors"],
            }
            if i:
                rows.append(row)
            print(("warm-up " if not i else f"run {i}: ") + json.dumps(row), flush=True)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print("\n" + machine())
        print(f"rollouts={args.rollouts}, latency={args.latency} s, repeats={args.repeats}")
        print("median: " + ", ".join(f"{k}={v:.4g}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
