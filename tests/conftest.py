"""Shared fixtures: a real `metrale sim` process on a free loopback port, and leak checks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

# The `real` marker, applied at collection, and the check that no unmarked test starts a real part.
from tests.real_parts import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)

# One modal emulator a session (the SDK keeps one client a process, from the env it first saw).
from tests.sandbox_sim.modal_sim import modal_sim  # noqa: F401

# The task images a session's real tests built, removed when it ends.
from tests.task_images import (
    _real_tests_take_their_task_images_away,  # noqa: F401
    remove_what_the_session_built,
)


@dataclass
class Sim:
    url: str
    proc: subprocess.Popen[str]
    model: str = "metrale-sim"


#: A simulator process built from a `SimConfig` (JSON in argv[1]), for the options that the
#: `metrale sim` command line does not expose (header delay, a required API key).
_SIM_FROM_CONFIG = (
    "import asyncio, json, sys\n"
    "from metrale.endpoint.sim import SimConfig, serve_forever\n"
    "asyncio.run(serve_forever(SimConfig(**json.loads(sys.argv[1]))))\n"
)


@contextlib.contextmanager
def start_sim(*args: str) -> Iterator[Sim]:
    """Start `metrale sim --port 0 ARGS...` and yield its URL; always stop it."""
    with _start_sim_process([sys.executable, "-m", "metrale", "sim", "--port", "0", *args]) as s:
        yield s


@contextlib.contextmanager
def start_sim_config(**config: object) -> Iterator[Sim]:
    """Start a simulator process from `SimConfig(port=0, **config)`; always stop it."""
    argv = [sys.executable, "-c", _SIM_FROM_CONFIG, json.dumps({"port": 0, **config})]
    with _start_sim_process(argv) as s:
        yield s


@contextlib.contextmanager
def _start_sim_process(argv: Sequence[str]) -> Iterator[Sim]:
    proc = subprocess.Popen(
        list(argv),
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
        # Drain what it prints from now on (aiohttp logs a traceback for each request its
        # client cancelled): a full pipe would stop the simulator mid-test.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
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


# --------------------------------------------------------------------------- skip ledger
#
# Every skipped test (and every skipped module, e.g. by importorskip) with its reason goes to
# the pytest cache as `metrale/skips` when the session ends. CI's `scripts/check_skips.py`
# reads it after the README's test command and fails on any skip not allowed for the machine
# in `tests/skips_allowed.toml`: a missing extra or tool in CI must not pass as green.

_SKIPS: list[dict[str, str]] = []


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append({"test": report.nodeid, "reason": _skip_reason(report)})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _SKIPS.append({"test": report.nodeid, "reason": _skip_reason(report)})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    remove_what_the_session_built()
    cache = getattr(session.config, "cache", None)
    if cache is not None:
        ran = session.testscollected
        cache.set("metrale/skips", {"collected": ran, "exitstatus": int(exitstatus),
                                    "skips": list(_SKIPS)})  # fmt: skip


async def cancel_when(run: Awaitable[object], until: Callable[[], bool], polls: int = 500) -> None:
    """Run `run` as a task, cancel it once `until()` holds (polled every 10 ms, `polls` times at
    most: the loop ends by itself), and expect it to end cancelled."""
    task = asyncio.ensure_future(run)
    for _ in range(polls):
        if until():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
