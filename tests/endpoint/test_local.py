"""The embedded llama-server: a real run, slots that batch concurrent calls, and no orphan on
any exit path."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from metrale.endpoint import local
from metrale.errors import UsageError
from tests.conftest import default_sigint, run_cli


def _missing() -> str | None:
    try:
        local.embedded_model_path()
        local.server_binary()
    except UsageError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=f"{_missing()}")


def children_named(parent: int, needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and needle in cmdline:
            pids.append(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_gsm8k_on_the_embedded_model(tmp_path: Path) -> None:
    proc = run_cli(
        ["run", "gsm8k", "--rollouts", "3", "--max-tokens", "48", "--out", str(tmp_path), "--json"],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["info"]["embedded"] is True
    assert result["info"]["model"] == local.MODEL_NAME
    assert result["info"]["preflight"] is not None  # answered or not, it is recorded
    metrics = result["result"]["metrics"]
    assert metrics["rollouts"] == 3 and metrics["errors"] == 0
    records = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    # llama-server sends usage in its last chunk when asked; counted chunks would say so.
    assert all(r["tokens"]["completion"] > 0 for r in records)
    assert all(r["tokens"]["source"] in {"usage", "counted"} for r in records)
    assert all(r["metrics"]["finish_reason"] in {"stop", "length"} for r in records)
    assert all(r["stages"]["generation"]["duration_s"] > 0 for r in records)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_orphan_server_when_metrale_is_stopped(tmp_path: Path, how: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "run", "gsm8k", "--rollouts", "200",
         "--max-tokens", "8", "--max-concurrent", "1", "--out", str(tmp_path), "--no-preflight"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        records = tmp_path / "rollouts.jsonl"
        # bounded, but not by how fast a loaded machine is: under a busy loop per core the
        # first 64-token rollout once took more than the 120 s this allowed
        deadline = time.monotonic() + 600
        servers: list[int] = []
        while time.monotonic() < deadline and not (records.exists() and records.stat().st_size):
            servers = servers or children_named(proc.pid, local.SERVER_BINARY)
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        servers = servers or children_named(proc.pid, local.SERVER_BINARY)
        assert servers, "the embedded server never started"
        assert records.exists() and records.stat().st_size, "no rollout finished in 600 s"
        proc.send_signal(how)
        proc.communicate(timeout=60)
        if how is not signal.SIGKILL:
            assert proc.returncode == 130
        assert wait_gone(servers), f"llama-server outlived metrale ({how.name})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert records.read_text().count("\n") >= 1


def test_missing_extra_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = local.importlib.util.find_spec
    monkeypatch.setattr(
        local.importlib.util,
        "find_spec",
        lambda name: None if name == local.MODEL_PACKAGE else real(name),
    )
    with pytest.raises(UsageError, match=r"pip install 'metrale\[local\]'.* or pass --target"):
        local.packaged_model_path()


def test_the_served_model_is_the_build_scripts_iq4_nl_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # scripts/test.sh ran the build script, so this venv holds the copy the server loads
    assert local.embedded_model_path() == Path(sys.prefix) / local.SERVED_FILE
    # a venv without it serves the shipped Q4_1, and the log says why that is slower
    monkeypatch.setattr(local.sys, "prefix", str(tmp_path))
    with caplog.at_level("WARNING", logger=local.__name__):
        assert local.embedded_model_path() == local.packaged_model_path()
    assert "IQ4_NL" in caplog.text and "no faster than single steps" in caplog.text


def test_server_stops_on_exit_and_records_a_crash() -> None:
    import asyncio

    async def go() -> local.LocalLlamaServer:
        server = local.LocalLlamaServer()
        async with server:
            pid = server._proc.pid  # type: ignore[union-attr]
            os.killpg(pid, signal.SIGKILL)
            for _ in range(50):
                if server._proc.poll() is not None:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.1)
        return server

    server = asyncio.run(go())
    assert server.died is not None and "exit code -9" in server.died


def _port_of(pid: int) -> int:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--port") + 1])


def _requests_processing(port: int) -> float | None:
    """llama-server's own gauge of requests being decoded, from its Prometheus page."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            page = resp.read().decode()
    except OSError:
        return None
    for line in page.splitlines():
        if line.startswith("llamacpp:requests_processing "):
            return float(line.split()[1])
    return None


def test_serve_at_concurrency_4_has_4_requests_processing_at_once(tmp_path: Path) -> None:
    """The run's concurrency becomes the server's slots, and the server batches them: its own
    /metrics, scraped during the run, shows 4 requests processing together."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "run", "serve", "--concurrency", "4",
         "--requests", "24", "--max-tokens", "48", "--input-tokens", "32",
         "--out", str(tmp_path / "run"), "--no-preflight", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[float] = []
    try:
        deadline = time.monotonic() + 600
        servers: list[int] = []
        while proc.poll() is None and time.monotonic() < deadline:
            servers = servers or children_named(proc.pid, local.SERVER_BINARY)
            if servers:
                with contextlib.suppress(OSError, ValueError):
                    value = _requests_processing(_port_of(servers[0]))
                    if value is not None:
                        seen.append(value)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "4 slots for concurrency 4" in err
    assert seen, "no /metrics page was read during the run"
    assert max(seen) == 4, f"requests processing at once: at most {max(seen)}"
