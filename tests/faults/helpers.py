"""What the fault tests share: the real CLI in a child process, and waiting on files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import default_sigint


def cli(args: Sequence[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metrale", *args],
        capture_output=True, text=True, timeout=timeout, **kw,
    )  # fmt: skip


def spawn(args: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
    """The CLI in its own session (a signal to it reaches no test process), with the default
    SIGINT even where the test runner was started with it ignored (a background job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "metrale", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=default_sigint, **kw,
    )  # fmt: skip


def wait_for(cond: Callable[[], bool], within_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {within_s} s")


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory`, by relative path, with its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def stop(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Wait for a spawned CLI (killing its group if it hangs); its stdout and stderr."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise
    return out, err
