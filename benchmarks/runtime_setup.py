"""Setup cost per runtime under concurrency: p50/p90 of `start()` with N sandboxes in flight.

Each of `--rollouts` rollouts does what a gsm8k rollout does with `--runtime`: start a sandbox
(timed: this is the setup stage), write a file, run one command, stop. At most `--concurrent`
are in flight, all released together, so at 512 the starts contend for the machine's CPUs the
way a 512-rollout run's do. Percentiles are over the per-rollout setup durations.

    python benchmarks/runtime_setup.py --runtime subprocess,bwrap --concurrent 1,64,512
    python benchmarks/runtime_setup.py --runtime docker --concurrent 1,64,512

With `docker` in `--runtime`, a `docker-bare` row per concurrency is measured in the same run,
right before it, as the floor: a bare `docker run -d IMAGE sleep infinity`, one
`docker exec NAME cat /etc/hostname` (the exec floor), then `rm -f`, through the same CLI and
engine, so the runtime's own overhead is the difference of the two rows (setup, and `exec`: one
command's round trip, p50).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time

from metrale.runtime import DockerConfig, check_runtime, runtime_config, runtime_factory
from metrale.runtime.procs import run_process
from metrale.stats import percentile


async def bare_docker(config: DockerConfig, i: int) -> tuple[float | None, float | None, bool]:
    """(seconds of a bare `run -d IMAGE sleep infinity`, of one bare `exec`, ok): the floor of
    the docker row."""
    name = f"metrale-floor-{os.getpid()}-{i}"
    argv = [config.cli, "run", "-d", "--name", name, "--label", "metrale.sandbox=1"]
    argv += ["--label", f"metrale.sandbox.pid={os.getpid()}", config.image, "sleep", "infinity"]
    started = time.perf_counter()
    result = await run_process(argv, env=os.environ, cwd=None, timeout=600, cap=1 << 16)
    took = time.perf_counter() - started
    exec_s = None
    if result.exit_code == 0:
        argv = [config.cli, "exec", name, "cat", "/etc/hostname"]
        started = time.perf_counter()
        done = await run_process(argv, env=os.environ, cwd=None, timeout=600, cap=1 << 16)
        exec_s = time.perf_counter() - started if done.exit_code == 0 else None
    rm = [config.cli, "rm", "-f", name]
    await run_process(rm, env=os.environ, cwd=None, timeout=300, cap=1 << 16)
    ok = result.exit_code == 0 and exec_s is not None
    return (took, exec_s, True) if ok else (None, None, False)


async def one_cell(name: str, rollouts: int, concurrent: int) -> dict[str, object]:
    config = runtime_config("docker" if name == "docker-bare" else name)
    check_runtime(config)
    make = runtime_factory(config)
    gate = asyncio.Semaphore(concurrent)
    setups: list[float] = []
    execs: list[float] = []
    errors = 0

    async def rollout(i: int) -> None:
        nonlocal errors
        async with gate:
            if name == "docker-bare":
                assert isinstance(config, DockerConfig)
                took, exec_s, ok = await bare_docker(config, i)
                if took is not None and exec_s is not None:
                    setups.append(took)
                    execs.append(exec_s)
                errors += not ok
                return
            runtime = make(i)
            started = time.perf_counter()
            try:
                await runtime.start()
                setups.append(time.perf_counter() - started)
                await runtime.write("task.txt", str(i))
                started = time.perf_counter()
                result = await runtime.run("cat task.txt", timeout=60)
                execs.append(time.perf_counter() - started)
                if result.stdout != str(i):
                    errors += 1
            except Exception:
                errors += 1
            finally:
                await runtime.stop()

    began = time.perf_counter()
    await asyncio.gather(*(rollout(i) for i in range(rollouts)))
    setups.sort()
    execs.sort()
    return {
        "runtime": name,
        "rollouts": rollouts,
        "concurrent": concurrent,
        "setup_p50_ms": round(1000 * (percentile(setups, 50) or float("nan")), 2),
        "setup_p90_ms": round(1000 * (percentile(setups, 90) or float("nan")), 2),
        "exec_p50_ms": round(1000 * (percentile(execs, 50) or float("nan")), 2),
        "errors": errors,
        "e2e_s": round(time.perf_counter() - began, 2),
    }


def machine() -> str:
    model = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB, Linux {platform.release()}, {model}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="subprocess,bwrap")
    parser.add_argument("--concurrent", default="1,64,512")
    parser.add_argument("--rollouts", type=int, help="default: max(64, 2 x concurrent)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    names = args.runtime.split(",")
    if "docker" in names:
        names.insert(names.index("docker"), "docker-bare")
    cells = [(name, int(c)) for name in names for c in args.concurrent.split(",")]
    # each docker cell right after its bare floor at the same concurrency: the same minutes
    cells.sort(key=lambda cell: (cell[0].startswith("docker"), cell[1] if "docker" in cell[0]
                                 else 0, cell[0] != "docker-bare"))  # fmt: skip
    for name, concurrent in cells:
        rollouts = args.rollouts or max(64, 2 * concurrent)
        rows.append(asyncio.run(one_cell(name, rollouts, concurrent)))
        if not args.json:
            r = rows[-1]
            print(f"{r['runtime']:<11} concurrent {r['concurrent']:>4}  rollouts "
                  f"{r['rollouts']:>5}  setup p50 {r['setup_p50_ms']:>8.2f} ms  "
                  f"p90 {r['setup_p90_ms']:>8.2f} ms  exec p50 {r['exec_p50_ms']:>7.2f} ms  "
                  f"errors {r['errors']}  e2e {r['e2e_s']} s", flush=True)  # fmt: skip
    print(f"machine: {machine()}")
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
