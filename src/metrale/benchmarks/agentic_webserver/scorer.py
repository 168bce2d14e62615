"""The scorer: does what the agent left build, run, and answer `GET /ping` with `pong`?

It runs in a fresh runtime on the iteration's sandbox (the agent's runtime is stopped first, so
nothing the agent left running answers for it): `cargo build --offline` within
`build_timeout_s`; then `cargo run --offline` started detached, output to a log, with
`METRALE_HARNESS_PORT` set to a fresh free port; then `curl /ping` every 0.25 s until the body
is `pong` (surrounding whitespace ignored) or `serve_timeout_s` has passed. Whatever happens it
kills the process group it started, then stops its runtime (which kills everything left in it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from metrale.runtime.base import Runtime

logger = logging.getLogger(__name__)

#: Beside the agent's work dir, in the rollout's own sandbox dir (relative to the work dir,
#: which is the cwd): never a shared /tmp, where concurrent rollouts under the subprocess
#: runtime would read (and kill by) each other's pid file.
SERVER_LOG = "../metrale-score-server.log"
PID_FILE = "../metrale-score-server.pid"


@dataclass
class ScoreResult:
    webserver_ok: bool
    note: str = ""
    build_s: float | None = None
    serve_s: float | None = None
    build_output: str = ""


def first_error(output: str) -> str:
    """The first `error...` line of cargo's output (or its last line), for a one-line note."""
    for line in output.splitlines():
        if re.match(r"\s*error(\[\w+\])?:", line):
            return line.strip()[:200]
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


async def score(
    runtime: Runtime,
    *,
    workdir: str,
    env: Mapping[str, str],
    port: int,
    build_timeout_s: float,
    serve_timeout_s: float,
) -> ScoreResult:
    """Build and serve the project in `workdir` inside the started `runtime`."""
    env = {**env, "METRALE_HARNESS_PORT": str(port)}
    has_manifest = await runtime.run(["test", "-f", "Cargo.toml"], env=env, cwd=workdir, timeout=30)
    if has_manifest.exit_code != 0:
        return ScoreResult(False, "no Cargo.toml in the working directory")
    started = time.perf_counter()
    build = await runtime.run(
        ["cargo", "build", "--offline", "--color", "never"],
        env=env,
        cwd=workdir,
        timeout=build_timeout_s,
    )
    build_s = time.perf_counter() - started
    output = build.stdout + build.stderr
    if build.timed_out:
        return ScoreResult(False, f"build timed out after {build_timeout_s:g} s", build_s, None,
                           output)  # fmt: skip
    if build.exit_code != 0:
        return ScoreResult(False, f"build failed: {first_error(output)}", build_s, None, output)
    launch = (
        f"setsid cargo run --offline --color never > {SERVER_LOG} 2>&1 < /dev/null & "
        f"echo $! > {PID_FILE}"
    )
    started = time.perf_counter()
    try:
        await runtime.run(["bash", "-c", launch], env=env, cwd=workdir, timeout=30)
        deadline = started + serve_timeout_s
        last = ""
        while time.perf_counter() < deadline:
            left = max(1.0, deadline - time.perf_counter())
            got = await runtime.run(
                ["curl", "-s", "--max-time", f"{min(2.0, left):g}",
                 f"http://127.0.0.1:{port}/ping"],
                env=env, cwd=workdir, timeout=min(5.0, left + 1),
            )  # fmt: skip
            if got.exit_code == 0 and got.stdout.strip() == "pong":
                return ScoreResult(True, "", build_s, time.perf_counter() - started, output)
            if got.exit_code == 0:
                last = got.stdout.strip()[:60]
            await asyncio.sleep(0.25)
        log = await runtime.run(["tail", "-n", "5", SERVER_LOG], env=env, cwd=workdir, timeout=10)
        why = f"GET /ping answered {last!r}" if last else "no answer on /ping"
        tail = " | ".join(log.stdout.strip().splitlines()[-2:])
        return ScoreResult(
            False,
            f"{why} within {serve_timeout_s:g} s"
            + (f" (server log: {tail[:160]})" if tail else ""),
            build_s,
            None,
            output,
        )
    finally:
        kill = f"kill -9 -- -$(cat {PID_FILE}) 2>/dev/null; fuser -k {port}/tcp 2>/dev/null; true"
        try:
            await runtime.run(["bash", "-c", kill], env=env, cwd=workdir, timeout=15)
        except Exception as exc:  # the sandbox's own stop ends the server too
            logger.debug("killing the scored server failed: %r", exc)
