"""Churn on the container engine: does it stay up when sandboxes come and go together?

`--workers` loops run side by side for `--seconds`, each a docker sandbox's whole life per
cycle: start (timed), write a file, two commands, stop. A cycle that takes over `--wedge-s`
means the engine stopped answering (a deadlock): the script says so and exits 1, leaving the
engine to be recovered (`bash scripts/container-engine.sh down`, `... up`, then
`metrale cleanup --runtime docker`).

`--unsized` creates containers through the configured CLI alone, as metrale did before podman's
own client took over creation on podman engines (docs/runtimes.md#the-container-engine): the
start latency of the two, side by side. (metrale's own cycle seldom hits the deadlock that
change avoids; `benchmarks/engine_deadlock.sh` reproduces it within a minute.)

    python benchmarks/engine_churn.py --workers 8 --seconds 200 --image metrale-task/fix-git:TAG
    python benchmarks/engine_churn.py --workers 8 --seconds 200 --unsized --image ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

import metrale.runtime.docker as docker_runtime
from metrale.runtime import DockerConfig, check_runtime, create_runtime
from metrale.stats import percentile


async def cycle(config: DockerConfig, tag: str) -> float:
    """One sandbox's life; the seconds its start took."""
    rt = create_runtime(config)
    began = time.perf_counter()
    await rt.start()
    took = time.perf_counter() - began
    try:
        await rt.write("in.txt", tag)
        if (await rt.run("cat in.txt")).stdout != tag or (await rt.run("exit 3")).exit_code != 3:
            raise RuntimeError(f"cycle {tag}: wrong output")
    finally:
        await rt.stop()
    return took


async def churn(
    config: DockerConfig, workers: int, seconds: float, wedge_s: float
) -> dict[str, object]:
    end = time.monotonic() + seconds
    starts: list[float] = []
    errors: list[str] = []

    async def worker(w: int) -> None:
        n = 0
        while time.monotonic() < end:
            try:
                starts.append(await asyncio.wait_for(cycle(config, f"{w}-{n}"), wedge_s))
            except TimeoutError:
                raise  # wedged: ends the churn
            except Exception as exc:  # a failed cycle is counted, the churn goes on
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
            n += 1

    began = time.perf_counter()
    tasks = [asyncio.ensure_future(worker(w)) for w in range(workers)]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    return {
        "wedged": any(t.exception() is not None for t in done),
        "seconds": round(time.perf_counter() - began, 1),
        "cycles": len(starts),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "start_p50_s": _seconds(percentile(starts, 50)),
        "start_p10_s": _seconds(percentile(starts, 10)),
        "start_p90_s": _seconds(percentile(starts, 90)),
    }


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def report(args: argparse.Namespace, config: DockerConfig) -> int:
    row = await churn(config, args.workers, args.seconds, args.wedge_s)
    row |= {
        "creator": " ".join(docker_runtime.container_creator(args.cli)[:2]),
        "workers": args.workers,
        "image": args.image,
        "machine": f"{platform.node()} {os.cpu_count()} cpus",
    }
    print(json.dumps(row), flush=True)
    if row["wedged"]:
        print("the engine stopped answering (wedged); recover it: see this script's docstring")
        sys.stdout.flush()
        os._exit(1)  # leaving now: the other sandboxes' stops would wait on the wedged engine
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--image", default=docker_runtime.DEFAULT_IMAGE)
    parser.add_argument("--cli", default="docker")
    parser.add_argument("--wedge-s", type=float, default=90.0, help="a cycle this long: wedged")
    parser.add_argument("--unsized", action="store_true", help="create as before the fix")
    args = parser.parse_args()
    config = DockerConfig(cli=args.cli, image=args.image)
    check_runtime(config)
    if args.unsized:
        docker_runtime.container_creator = lambda cli: (cli,)
    return asyncio.run(report(args, config))


if __name__ == "__main__":
    raise SystemExit(main())
