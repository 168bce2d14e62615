"""`metrale sandbox-sim modal` in a child process for tests: its address, the env the SDK needs
(credentials, a config file of the test's own), its `GET /_state`; always stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class ModalSim:
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[str]

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.env["METRALE_SANDBOX_SIM_STATE"], timeout=10) as r:
            state: dict[str, Any] = json.load(r)
        return state

    def live(self) -> list[dict[str, Any]]:
        live: list[dict[str, Any]] = self.state()["live"]
        return live

    def child_env(self, **extra: str) -> dict[str, str]:
        """metrale's environment plus the SDK's: what a `metrale run --runtime modal` gets."""
        return {**os.environ, **self.env, **extra}


@contextlib.contextmanager
def start_modal_sim(*args: str) -> Iterator[ModalSim]:
    """`metrale sandbox-sim modal --port 0 ARGS...`; stopped (its sandboxes too) on exit."""
    pytest.importorskip("modal", reason="the modal extra is not installed")
    handle, config_path = tempfile.mkstemp(prefix="metrale-modal-", suffix=".toml")
    os.close(handle)  # an empty config: no profile of the user's is read
    argv = [sys.executable, "-m", "metrale", "sandbox-sim", "modal", "--port", "0", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if "listening on" not in first:
            raise RuntimeError(f"metrale sandbox-sim modal did not start: {first!r}")
        env = {"MODAL_CONFIG_PATH": config_path}
        while len(env) < 5:
            key, _, value = proc.stdout.readline().strip().partition("=")
            env[key] = value
        yield ModalSim(url=env["MODAL_SERVER_URL"], env=env, proc=proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        os.unlink(config_path)


@pytest.fixture(scope="session")
def modal_sim() -> Iterator[ModalSim]:
    """One emulator for the session, its env set in this process (the SDK keeps one client per
    process, from the environment it first sees)."""
    with start_modal_sim() as sim:
        saved = {k: os.environ.get(k) for k in sim.env}
        os.environ.update(sim.env)
        try:
            yield sim
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
