"""What every benchmark script needs: a `metrale sim` in its own process, and the machine line."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sim(*flags: str) -> Iterator[str]:
    """`metrale sim --port 0 FLAGS...` in its own process group; yields its base URL.

    The simulator is in a session of its own (a Ctrl-C at the terminal reaches the script,
    which stops it), so nothing but this `finally` stops it: while it runs, the script's
    SIGTERM (by default a death that unwinds nothing) is turned into `SystemExit(143)`."""
    before = signal.getsignal(signal.SIGTERM)
    if before == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "sim", "--port", "0", *flags],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().rsplit(" ", 1)[-1].strip()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        if before == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, before)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def machine() -> str:
    """The line each script prints under its figures: cores, CPU, kernel, Python."""
    return (
        f"machine: {os.cpu_count()} cores, {cpu_model()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
