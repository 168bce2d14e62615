"""Client capacity: the highest request rate each client sustains against a zero-latency sim.

Both clients, side by side in one run, against the same `metrale sim` (no TTFT, no inter-token
delay, 16 output tokens, usage on), the same JSONL prompts, constant arrivals. A rate is
*sustained* when the client's scheduling lag (actual send − intended send) has p99 under 5 ms,
the achieved request rate is within 5% of the offered one, and no request failed. Each client
climbs the same ladder of rates while it keeps up (achieved >= 95% of offered, no errors), so
the table shows its lag at every rate it can drive; the figures are the highest sustained rate
and the highest rate kept up.

- metrale: `metrale run serve --load rate --arrivals constant`; lag from `sched_lag_ms_p99`.
- guidellm: `guidellm run --profile kind=constant`; lag per request from its own timings,
  `request_start − targeted_start`.

Usage: python benchmarks/serve_client_capacity.py [--duration 3] [--guidellm PATH]
(guidellm in its own venv: python -m venv /tmp/gllm && /tmp/gllm/bin/pip install guidellm)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import sim

LADDER = [5, 10, 25, 50, 100, 200, 400, 600, 800, 1000, 1300, 1600, 2000, 2500, 3000, 4000]
LAG_P99_MS = 5.0


def pctl(values: list[float], q: float) -> float:
    from metrale.stats import percentile

    p = percentile(values, q)
    return float("nan") if p is None else p


def run_metrale(url: str, rate: float, duration: float, prompts: Path, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--no-preflight",
        "--load", "rate", "--rate", str(rate), "--arrivals", "constant", "--requests", "none",
        "--duration-s", str(duration), "--prompts", str(prompts), "--max-tokens", "16",
        "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=duration * 10 + 60, check=False
    )
    if not (out / "result.json").is_file():
        raise RuntimeError(f"metrale failed: {proc.stderr.strip()[-300:]}")
    m = json.loads((out / "result.json").read_text())["result"]["metrics"]
    return {
        "lag_p50_ms": m.get("sched_lag_ms_p50"),
        "lag_p99_ms": m.get("sched_lag_ms_p99"),
        "achieved": m.get("request_throughput") or 0.0,
        "errors": m.get("errors"),
        "ttft_p50_ms": m.get("ttft_ms_p50"),
    }


def run_guidellm(
    exe: str, url: str, rate: float, duration: float, prompts: Path, out: Path
) -> dict:
    root = url.removesuffix("/v1")
    cmd = [
        exe, "run", "--backend", f"kind=openai_http,target={root},model=metrale-sim",
        "--profile", f"kind=constant,rate={rate}",
        "--constraint", f"kind=max_duration,seconds={duration:g}",
        "--data", f"kind=json_file,path={prompts}",
        "--output", f"kind=json,path={out}", "--disable-console",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 10 + 180)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"guidellm failed: {(proc.stderr or proc.stdout)[-400:]}")
    bench = json.loads(out.read_text())["benchmarks"][0]
    reqs = bench["requests"]
    ok = reqs["successful"]
    lags = [
        (r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"]) * 1000
        for r in ok
        if r["info"]["timings"].get("request_start") and r["info"]["timings"].get("targeted_start")
    ]
    return {
        "lag_p50_ms": pctl(lags, 50),
        "lag_p99_ms": pctl(lags, 99),
        "achieved": len(ok) / bench["duration"] if bench["duration"] else 0.0,
        # Requests still in flight when max_duration ends are "incomplete": not failures.
        "errors": len(reqs["errored"]),
        "ttft_p50_ms": pctl([r["time_to_first_token_ms"] for r in ok], 50),
    }


def keeps_up(row: dict, rate: float) -> bool:
    return row["achieved"] >= 0.95 * rate and not row["errors"]


def sustained(row: dict, rate: float) -> bool:
    return keeps_up(row, rate) and row["lag_p99_ms"] is not None and row["lag_p99_ms"] < LAG_P99_MS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--guidellm", default=shutil.which("guidellm") or "/tmp/gllm-venv/bin/guidellm")
    ap.add_argument("--rates", default=",".join(map(str, LADDER)))
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="serve-capacity-"))
    prompts = work / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(int(max(rates) * args.duration * 1.5) + 100):
            f.write(json.dumps({"prompt": f"{i} write one short sentence about the sea"}) + "\n")
    best: dict[str, float] = {"metrale": 0.0, "guidellm": 0.0}
    kept: dict[str, float] = {"metrale": 0.0, "guidellm": 0.0}
    broken = {"metrale": False, "guidellm": False}  # a rung missed: no higher rate counts
    alive = {"metrale": True, "guidellm": Path(args.guidellm).exists()}
    if not alive["guidellm"]:
        print(f"guidellm not found at {args.guidellm}", file=sys.stderr)
    print("| client | offered req/s | achieved req/s | lag p50 ms | lag p99 ms | errors | ok |")
    print("|---|---|---|---|---|---|---|")
    with sim() as url:
        for rate in rates:
            for client in ("metrale", "guidellm"):
                if not alive[client]:
                    continue
                out = work / f"{client}-{rate:g}"
                try:
                    if client == "metrale":
                        row = run_metrale(url, rate, args.duration, prompts, out)
                    else:
                        row = run_guidellm(
                            args.guidellm,
                            url,
                            rate,
                            args.duration,
                            prompts,
                            out.with_suffix(".json"),
                        )
                except Exception as exc:  # a crashed client ends its climb, with the reason
                    print(f"| {client} | {rate:g} | failed: {exc} | | | | no |")
                    alive[client] = False
                    continue
                ok = sustained(row, rate)
                print(
                    f"| {client} | {rate:g} | {row['achieved']:.0f} | {row['lag_p50_ms']:.2f} | "
                    f"{row['lag_p99_ms']:.2f} | {row['errors']} | {'yes' if ok else 'no'} |",
                    flush=True,
                )
                if ok and not broken[client]:
                    best[client] = rate
                broken[client] = broken[client] or not ok
                if keeps_up(row, rate):
                    kept[client] = rate
                else:
                    alive[client] = False
                time.sleep(0.5)
            if not any(alive.values()):
                break
    print()
    for name, got in (
        ("sustained (lag p99 < 5 ms at it and every rate below)", best),
        ("kept up (>= 95% achieved)", kept),
    ):
        ratio = got["metrale"] / got["guidellm"] if got["guidellm"] else float("inf")
        print(f"highest rate {name}: metrale {got['metrale']:g} req/s, guidellm "
              f"{got['guidellm']:g} req/s, ratio {ratio:.1f}x")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
