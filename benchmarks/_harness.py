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


@contextlib.contextmanager
def sim(*flags: str) -> Iterator[str]:
    """`metrale sim --port 0 FLAGS...` in its own process group; yields its base URL."""
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
