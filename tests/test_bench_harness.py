"""benchmarks/_harness.py: a benchmark script killed with SIGTERM stops the simulator it
started (the simulator is in a session of its own, so nothing else would)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from _harness import sim
with sim() as url:
    print(url, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has stopped: only its parent's wait is missing
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_benchmark_script_sigtermed_stops_its_simulator() -> None:
    simulator: int | None = None
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(ROOT / "benchmarks")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://"), url
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1, children
        simulator = int(children[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(simulator) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(simulator), "the simulator outlived the script"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if simulator is not None and _alive(simulator):  # the failure is reported, not left
            os.kill(simulator, signal.SIGKILL)
