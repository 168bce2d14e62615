"""Shared fixtures: a real `metrale sim` process on a free loopback port, and leak checks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest


@dataclass
class Sim:
    url: str
    proc: subprocess.Popen[str]
    model: str = "metrale-sim"


@contextlib.contextmanager
def start_sim(*args: str) -> Iterator[Sim]:
    """Start `metrale sim --port 0 ARGS...` and yield its URL; always stop it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            rest = proc.stdout.read() if proc.poll() is not None else ""
            raise RuntimeError(f"metrale sim did not start: {line}{rest}")
        yield Sim(url=line.rsplit(" ", 1)[-1].strip(), proc=proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="session")
def sim() -> Iterator[Sim]:
    """A fast simulator shared by the session: 16 tokens, no delay, usage on."""
    with start_sim() as s:
        yield s


@pytest.fixture
def sim_factory() -> Iterator[object]:
    """Start simulators with custom flags for one test: `sim_factory("--ttft", "0.1")`."""
    with contextlib.ExitStack() as stack:

        def make(*args: str) -> Sim:
            return stack.enter_context(start_sim(*args))

        yield make


def run_cli(
    args: Sequence[str], timeout: float = 300, **kw: object
) -> subprocess.CompletedProcess[str]:
    """Run the real `metrale` command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "metrale", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,  # type: ignore[arg-type]
    )


def default_sigint() -> None:
    """preexec_fn: give the child the default SIGINT even when this process ignores it.

    A job started in the background by a non-interactive shell (as CI may start us) inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler in its children;
    tests that press Ctrl-C on metrale must undo that.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
