"""What bounds the embedded model's concurrency-4 gain: llama-server's own step and prompt times.

Issue 25 asks `metrale run serve` on the embedded model for at least 2x the output tokens/s at
concurrency 4 as at concurrency 1. With n output tokens a request, a prompt costing P, a
one-sequence decode step d1 and a four-sequence step d4, one request alone takes P + n·d1 and
four at once take P4 + n·d4, where P4 is the four prompts processed as one batch (compute:
close to 4P), so

    ratio = 4 (P + n·d1) / (P4 + n·d4)  <  4 d1 / d4   (the second: prompts free)

and 2x needs d4 / d1 <= 2 + (2P - P4) / (n·d1), a little under 2. This script measures P, P4,
d1 and d4 from the server's own `timings` (not the client's clock), on the server metrale
starts (its binary, model and flags, 4 slots), and the wall-clock ratio beside them. Each
round: 4 requests one after another, then 4 at once; each prompt is exactly `--input-tokens`
token ids (seeded, distinct per request, no prompt cache); `ignore_eos`, so every request
generates exactly `--max-tokens`.

`--side=FLAGS` (repeatable) adds a server with extra llama-server flags (`--side="-fa off"`);
`ENV:NAME=VALUE` in FLAGS sets the server's environment instead. All sides start at once and
the rounds alternate between them, so they share the machine's load.

Usage: python benchmarks/embedded_steps.py [--rounds 4] [--side FLAGS ...]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import statistics
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from _harness import machine

from metrale.endpoint import local


class Server(local.LocalLlamaServer):
    """metrale's launcher with extra flags and environment (one A/B side)."""

    def __init__(self, side: str) -> None:
        super().__init__(parallel=4)
        words = side.split()
        self.extra = [w for w in words if not w.startswith("ENV:")]
        self.env = dict(w[4:].split("=", 1) for w in words if w.startswith("ENV:"))

    def command(self, model: Path, binary: Path) -> list[str]:
        return [*super().command(model, binary), *self.extra]


@contextlib.contextmanager
def servers(sides: list[str]) -> Iterator[list[Server]]:
    started: list[Server] = []
    saved = dict(os.environ)
    try:
        for side in sides:
            server = Server(side)
            os.environ.update(server.env)  # the launcher's child inherits it
            asyncio.run(server.start())
            os.environ.clear()
            os.environ.update(saved)
            started.append(server)
        yield started
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for server in started:
            server.stop()


def complete(server: Server, seed: int, args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(seed)
    body = {
        "prompt": [rng.randrange(1000, 40000) for _ in range(args.input_tokens)],
        "n_predict": args.max_tokens,
        "ignore_eos": True,
        "cache_prompt": False,
        "temperature": 0.7,
    }
    request = urllib.request.Request(
        f"{server.root_url}/completion",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        timings: dict[str, float] = json.loads(resp.read())["timings"]
    return timings


def one_round(server: Server, seed: int, args: argparse.Namespace) -> dict[str, float]:
    tokens = 4 * args.max_tokens
    t0 = time.perf_counter()
    alone = [complete(server, seed + i, args) for i in range(4)]
    c1 = tokens / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda i: complete(server, seed + 4 + i, args), range(4)))
    c4 = tokens / (time.perf_counter() - t0)
    d1 = statistics.median(t["predicted_per_token_ms"] for t in alone)
    d4 = statistics.median(t["predicted_per_token_ms"] for t in together)
    p = statistics.median(t["prompt_ms"] for t in alone)
    p4 = max(t["prompt_ms"] for t in together)  # the four prompts, processed as one batch
    n = args.max_tokens
    return {
        "c1": c1,
        "c4": c4,
        "ratio": c4 / c1,
        "d1": d1,
        "d4": d4,
        "p": p,
        "p4": p4,
        "steps": d4 / d1,
        "model": 4 * (p + n * d1) / (p4 + n * d4),
        "free": 4 * d1 / d4,
        "needed": 2 + (2 * p - p4) / (n * d1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--side", action="append", default=[], help="extra llama-server flags")
    args = parser.parse_args()
    sides = ["", *args.side]
    rows: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with servers(sides) as running:
        for server in running:
            complete(server, 0, args)  # warm: page the model in
        for r in range(args.rounds):
            for side, server in zip(sides, running, strict=True):
                row = one_round(server, 1000 * (r + 1), args)
                rows[side].append(row)
                print(
                    f"round {r + 1} [{side or 'as metrale starts it'}]: c1 {row['c1']:.1f} "
                    f"c4 {row['c4']:.1f} tok/s, ratio {row['ratio']:.2f}; d1 {row['d1']:.2f} "
                    f"d4 {row['d4']:.2f} ms, P {row['p']:.0f} ms, P4 {row['p4']:.0f} ms",
                    flush=True,
                )
    print(
        f"\n{local.server_binary().name}, {local.embedded_model_path().name}, 4 slots, "
        f"{args.input_tokens} prompt and {args.max_tokens} output tokens; "
        f"{args.rounds} alternating rounds from {started}, medians\n"
    )
    print(
        "| server | c=1 tok/s | c=4 tok/s | c=4 / c=1 (per round) | P ms | P4 ms | d1 ms "
        "| d4 ms | d4 / d1 | 2x needs d4 / d1 <= | model's ratio | ratio with free prompts |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for side in sides:
        got = rows[side]

        def med(key: str, got: list[dict[str, float]] = got) -> float:
            return statistics.median(row[key] for row in got)

        per_round = " / ".join(f"{row['ratio']:.2f}" for row in got)
        print(
            f"| {side or 'as metrale starts it'} | {med('c1'):.1f} | {med('c4'):.1f} "
            f"| **{med('ratio'):.2f}x** ({per_round}) "
            f"| {med('p'):.0f} | {med('p4'):.0f} | {med('d1'):.2f} | {med('d4'):.2f} "
            f"| {med('steps'):.2f} "
            f"| {med('needed'):.2f} | {med('model'):.2f}x | {med('free'):.2f}x |"
        )
    print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
