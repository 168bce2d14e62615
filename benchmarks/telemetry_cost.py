"""What sampling a server's /metrics every 250 ms costs a run: paired runs with and without.

Two `metrale sim` processes, identical but for `--metrics vllm` (a page to sample: metrale
takes one GET every 250 ms for the whole run) and `--metrics none` (a 404: one GET, one note,
no more). Each repetition runs `metrale run serve` against both, in alternating order, at a fixed
concurrency against a sim with a fixed TTFT and inter-token delay, so that the server's
capacity is known and the client's work dominates: any cost of the sampling shows as lower
request throughput, higher TTFT or higher scheduling lag in the sampled runs. The figures are
the medians over repetitions of each side and their ratio (sampled / not).

Usage: python benchmarks/telemetry_cost.py [--reps 7] [--requests 400] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import machine, sim

KEYS = ("request_throughput", "ttft_ms_p50", "ttft_ms_p99", "sched_lag_ms_p99")


def serve(url: str, out: Path, requests: int, concurrency: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--no-preflight",
           "--concurrency", str(concurrency), "--requests", str(requests), "--max-tokens", "16",
           "--input-tokens", "64", "--out", str(out), "--quiet"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"serve failed: {proc.stderr}")
    result = json.loads((out / "result.json").read_text())["result"]
    metrics: dict[str, float] = result["metrics"]
    metrics["samples"] = metrics.get("server_telemetry_samples") or 0.0
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    flags = ("--ttft", "0.02", "--itl", "0.002", "--output-tokens", "16")
    runs: dict[str, list[dict[str, float]]] = {"sampled": [], "not sampled": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        sim(*flags, "--metrics", "vllm") as with_page,
        sim(*flags, "--metrics", "none") as without,
    ):
        for rep in range(args.reps):
            order = [("sampled", with_page), ("not sampled", without)]
            for name, url in order if rep % 2 == 0 else order[::-1]:
                out = Path(tmp) / f"{name.replace(' ', '-')}-{rep}"
                runs[name].append(serve(url, out, args.requests, args.concurrency))
    print(f"serve --concurrency {args.concurrency} --requests {args.requests}, "
          f"{args.reps} reps, medians")  # fmt: skip
    print(f"{'':<14}" + "".join(f"{k:>20}" for k in (*KEYS, "samples")))
    med = {n: {k: statistics.median(r[k] for r in rows) for k in (*KEYS, "samples")}
           for n, rows in runs.items()}  # fmt: skip
    for name, row in med.items():
        print(f"{name:<14}" + "".join(f"{row[k]:>20.3f}" for k in (*KEYS, "samples")))
    ratio = {k: med["sampled"][k] / med["not sampled"][k] for k in KEYS if med["not sampled"][k]}
    print(f"{'ratio':<14}" + "".join(f"{ratio.get(k, float('nan')):>20.3f}" for k in KEYS))
    print(machine())


if __name__ == "__main__":
    main()
