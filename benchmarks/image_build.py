"""What the namespaced image builder costs a task's build: the engine's own build (host root,
CVE-2024-1753) against metrale's builder (root of an unprivileged user namespace, images moved
by save/load), the same task uncached, alternating, in the same minutes.

    python benchmarks/image_build.py --task fix-git --repeats 3

Needs root (the builder's namespace) and the engine of scripts/container-engine.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time

from metrale.benchmarks.terminal_bench import images
from metrale.benchmarks.terminal_bench.builder import find_builder
from metrale.benchmarks.terminal_bench.task import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="fix-git")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cli", default="docker")
    args = parser.parse_args()
    task = load_task(args.task)
    builder = find_builder()
    if builder is None:
        raise SystemExit("the namespaced builder cannot run here (not root, or no subuid range)")
    base_ids = asyncio.run(images.resolve_bases(task, args.cli, {}))
    tag = images.image_tag(task, images.context_hash(task, base_ids))
    times: dict[str, list[float]] = {"engine": [], "namespace": []}
    for _ in range(args.repeats):
        for name in times:
            subprocess.run([args.cli, "rmi", "-f", tag], capture_output=True, timeout=120)
            started = time.perf_counter()
            if name == "engine":
                build = images._build_in_engine(task, args.cli, tag, base_ids, 600)
            else:
                build = images._build_in_namespace(builder, task, args.cli, tag, base_ids, 600)
            asyncio.run(build)
            times[name].append(time.perf_counter() - started)
    subprocess.run([args.cli, "rmi", "-f", tag], capture_output=True, timeout=120)
    for name, values in times.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{task.name} {name:9s} median {statistics.median(values):.2f} s  ({shown})")


if __name__ == "__main__":
    main()
