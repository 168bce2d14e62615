"""The embedded model under load, before and after llama-server: `metrale run serve` at each
concurrency level against today's embedded target and the one it replaced, interleaved.

- **after**: `metrale run serve --concurrency C` with no `--target`, the user's path: metrale
  starts llama.cpp's C++ `llama-server` with C slots (continuous batching, prompt cache,
  `/metrics`). While it runs, the script scrapes the server's `/metrics` every 50 ms and keeps
  the largest `llamacpp:requests_processing` (requests the server decoded at once).
- **before**: the embedded target until issue 25, llama-cpp-python's Python server
  (`python -m llama_cpp.server`, one global lock around the model: one request at a time),
  started by this script with the flags metrale gave it, and `metrale run serve --target URL`.
  It needs llama-cpp-python in this venv (`pip install 'llama-cpp-python[server]==0.3.36'`,
  built with the README's portable CMAKE_ARGS); without it the script measures "after" only.

Each round runs every level on both servers in turn, so both see the same load from the rest
of the machine; the figures are medians over rounds. The check (issue 25): at concurrency 4,
output tokens/s at least 2x that at concurrency 1, and up to 4 requests processing at once.

Usage: python benchmarks/embedded_serve.py [--levels 1,2,4,8] [--rounds 2] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from _harness import machine

from metrale.endpoint import local
from metrale.net import free_port


def _children(parent: int, needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and needle in (entry / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                found.append(int(entry.name))
    return found


def _processing(pid: int) -> float | None:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    port = int(argv[argv.index(b"--port") + 1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("llamacpp:requests_processing "):
                return float(line.split()[1])
    return None


def serve(
    args: argparse.Namespace, level: int, out: Path, target: str | None
) -> tuple[dict[str, float], float | None]:
    """One `metrale run serve` at `level`; its metrics, and (embedded) the most requests the
    server's /metrics showed processing at once."""
    cmd = [
        sys.executable, "-m", "metrale", "run", "serve", "--concurrency", str(level),
        "--requests", str(max(args.requests, 4 * level)), "--max-tokens", str(args.max_tokens),
        "--input-tokens", str(args.input_tokens), "--no-preflight", "--quiet", "--out", str(out),
    ]  # fmt: skip
    if target:
        cmd += ["--target", target]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        server: list[int] = []
        while not stop.is_set():
            server = server or _children(proc.pid, local.SERVER_BINARY)
            with contextlib.suppress(OSError, ValueError):
                value = _processing(server[0]) if server else None
                if value is not None:
                    peak.append(value)
            time.sleep(0.05)

    watcher = threading.Thread(target=scrape, daemon=True)
    if target is None:
        watcher.start()
    try:
        _, err = proc.communicate(timeout=1800)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if target is None:
        watcher.join()
    if not (out / "result.json").is_file():
        raise RuntimeError(err[-600:])
    m = json.loads((out / "result.json").read_text())["result"]["metrics"]
    wanted = ("output_throughput", "tpot_ms_p50", "ttft_ms_p50", "output_tokens_mean", "errors")
    return {k: m[k] for k in wanted}, (max(peak) if peak else None)


@contextlib.contextmanager
def old_server() -> Iterator[str | None]:
    """llama-cpp-python's server with the flags metrale's old launcher gave it, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        yield None
        return
    port = free_port()
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(local.embedded_model_path()),
        "--model_alias", local.MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", "4096", "--n_threads", str(os.cpu_count() or 1), "--verbose", "False",
        "--interrupt_requests", "False",
    ]  # fmt: skip
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    # its own process group, killed with this script whatever ends it (as metrale's was)
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=local._die_with_parent,  # setsid + PR_SET_PDEATHSIG
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2),
            ):
                break
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the old server exited: {log.read()[-400:]!r}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="per level (at least 4 x it)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--input-tokens", type=int, default=32)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    levels = [int(x) for x in args.levels.split(",")]
    after: dict[int, list[dict[str, float]]] = {c: [] for c in levels}
    before: dict[int, list[dict[str, float]]] = {c: [] for c in levels}
    peaks: dict[int, list[float]] = {c: [] for c in levels}
    with tempfile.TemporaryDirectory() as tmp, old_server() as old_url:
        if old_url is None:
            print("llama-cpp-python is not installed: measuring after only", file=sys.stderr)
        for r in range(args.rounds):
            for c in levels:
                m, peak = serve(args, c, Path(tmp) / f"after-{r}-{c}", None)
                after[c].append(m)
                if peak is not None:
                    peaks[c].append(peak)
                line = f"round {r + 1} c={c}: after {m['output_throughput']:.1f} tok/s"
                if old_url:
                    b, _ = serve(args, c, Path(tmp) / f"before-{r}-{c}", old_url)
                    before[c].append(b)
                    line += f", before {b['output_throughput']:.1f} tok/s"
                print(line, file=sys.stderr, flush=True)
    print(
        f"metrale run serve on the embedded SmolLM2-135M, {args.rounds} interleaved rounds, "
        f"max_tokens {args.max_tokens}, input_tokens {args.input_tokens}, medians\n"
    )
    print("| concurrency | before tok/s | after tok/s | before TPOT ms | after TPOT ms "
          "| after: requests processing at once (max) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for c in levels:
        b_tps = f"{median(before[c], 'output_throughput'):.1f}" if before[c] else "-"
        b_tpot = f"{median(before[c], 'tpot_ms_p50'):.1f}" if before[c] else "-"
        peak = f"{max(peaks[c]):g}" if peaks[c] else "-"
        print(f"| {c} | {b_tps} | {median(after[c], 'output_throughput'):.1f} | {b_tpot} "
              f"| {median(after[c], 'tpot_ms_p50'):.1f} | {peak} |")  # fmt: skip
    passed = True
    if 1 in levels and 4 in levels:
        for name, rows in (("before", before), ("after", after)):
            if rows[1]:
                ratio = median(rows[4], "output_throughput") / median(rows[1], "output_throughput")
                print(f"\n{name}: concurrency 4 / 1 output tokens/s = {ratio:.2f}x")
        ratio = median(after[4], "output_throughput") / median(after[1], "output_throughput")
        peak4 = max(peaks[4]) if peaks[4] else 0
        passed = ratio >= 2 and peak4 == 4
        print(f"check (after >= 2x and 4 processing at once): {'met' if passed else 'NOT met'}")
    errors = sum(m["errors"] for rows in (*after.values(), *before.values()) for m in rows)
    print(f"errors: {errors:g}\n{machine()}")
    return 0 if passed and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
