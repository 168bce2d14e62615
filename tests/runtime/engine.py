"""Finding the container engine for the docker tests: DOCKER_HOST (or the CLI's default) when
an engine answers there, else the one scripts/container-engine.sh reports as up (its `status`
prints the exports, applied here to this test process). Locally a missing engine skips with the
reason; in CI (CI=true, where .ci/run brings the engine up) it fails.

Nothing runs on import: collecting the suite must not call `docker` or start the engine's
script; the first test that needs the engine asks, and the answer is kept for the session.

An engine that answered once and stops answering is wedged (podman 4.3's storage locks
deadlock: image commands still answer, container commands hang forever; the docker runtime
avoids the known cause, docs/runtimes.md#the-container-engine). Every test that
needs it then fails at once with that reason, rather than each waiting out its own timeouts:
a CI run ends in minutes with the cause on its first failure, not at its time limit."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from metrale.runtime.configs import DEFAULT_IMAGE

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "container-engine.sh"


def _answers() -> str | None:
    """None when `docker` reaches an engine holding the default image, else why not."""
    try:
        probe = subprocess.run(
            ["docker", "image", "inspect", DEFAULT_IMAGE],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "'docker image inspect' did not answer in 30 s"
    if probe.returncode != 0:
        return (probe.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return None


@functools.cache
def engine_problem() -> str | None:
    """Why there is no engine to test against, or None when there is one (asked once)."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    why = _answers()
    if why is None:
        return None
    status = subprocess.run(
        ["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=60, check=False
    )
    if status.returncode != 0:
        return f"{why}; and {SCRIPT.name} status says the engine is not up"
    for line in status.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            os.environ[key] = value
    return _answers()


#: How long `docker ps` may take before the engine counts as wedged (it answers in ~0.1 s).
PS_TIMEOUT_S = 30


class _Wedged:
    why: str | None = None


def wedged() -> str | None:
    """Why the engine no longer answers container commands, or None (asked before each test;
    once wedged, not asked again)."""
    if _Wedged.why is None:
        try:
            subprocess.run(["docker", "ps", "-aq"], capture_output=True, timeout=PS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _Wedged.why = (
                f"the container engine stopped answering: 'docker ps' hung for {PS_TIMEOUT_S} s "
                f"(a wedged engine; recover with: bash {SCRIPT} down && bash {SCRIPT} up)"
            )
    return _Wedged.why


def require_engine() -> None:
    """Skip (locally) or fail (in CI) when there is no engine to test against; fail when the
    engine that was there is wedged."""
    problem = engine_problem()
    if problem is not None:
        message = f"no container engine ({problem}); bring one up: bash {SCRIPT} up"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the docker tests: {message}")
        pytest.skip(message)
    why = wedged()
    if why is not None:
        pytest.fail(why)


def labelled_containers(**labels: str) -> list[str]:
    argv = ["docker", "ps", "-aq", "--filter", "label=metrale.sandbox"]
    for key, value in labels.items():
        argv += ["--filter", f"label={key}={value}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.split()
