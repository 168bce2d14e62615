"""`metrale sandbox-sim prime` for tests: started as a user starts it (the command line, in a
child process), its client environment read from what it prints, stopped with SIGTERM (which
deletes whatever is still live). `state()` is its `GET /_state`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass
class Emulator:
    proc: subprocess.Popen[str]
    env: dict[str, str]

    @property
    def root(self) -> str:
        return self.env["PRIME_API_BASE_URL"].removesuffix("/api/v1")

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.root}/_state", timeout=30) as response:
            state: dict[str, Any] = json.loads(response.read())
        return state

    def left(self) -> list[Any]:
        """Every sandbox the service still holds (pending or running), and any real sandbox
        behind it that no longer belongs to one (there must be none)."""
        state = self.state()
        held = {s["id"] for s in state["sandboxes"]}
        orphans = [s for s in state["live"] if s["labels"].get("prime_id") not in held]
        return [*state["sandboxes"], *orphans]


def child_env() -> dict[str, str]:
    """metrale's environment for a child `python -m metrale`: this checkout's source first."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@contextlib.contextmanager
def prime_emulator(*flags: str) -> Iterator[Emulator]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "sandbox-sim", "prime", "--port", "0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        if not lines[0].startswith("metrale sandbox-sim prime listening on"):
            raise RuntimeError(f"the emulator did not start: {lines} {proc.stderr}")
        env = dict(line.strip().split("=", 1) for line in lines[1:])
        yield Emulator(proc, env)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def client_env(emulator: Emulator) -> Iterator[None]:
    """This process's environment pointed at `emulator` (the SDK reads it), then restored."""
    saved = {k: os.environ.get(k) for k in emulator.env}
    os.environ.update(emulator.env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
