"""The prime runtime against `metrale sandbox-sim prime` (bwrap behind it), through the official
SDK: whole runs with nothing left in the service, refusals counted as runtime retries, stuck
creations failed and deleted, a cancelled start deleted, a lost gateway, a SIGKILLed run
cleaned up, credentials kept out of everything, and the three usage errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from metrale.rollout.teardown import finish
from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.base import SandboxLostError
from tests.conftest import Sim, run_cli
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.prime_emulator import Emulator, child_env, client_env, prime_emulator

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")
pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")

KEY = "sim-prime-key"


def run_gsm8k(
    sim: Sim, emulator: Emulator, out: Path, *extra: str, home: Path | None = None
) -> dict[str, Any]:
    env = {**child_env(), **emulator.env, **({"HOME": str(home)} if home else {})}
    proc = run_cli(
        ["run", "gsm8k", "--target", sim.url, "--runtime", "prime", "--out", str(out),
         "--json", *extra],
        env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    result["stderr"] = proc.stderr
    return result


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]


def test_gsm8k_64_rollouts_no_errors_nothing_left(sim: Sim, tmp_path: Path) -> None:
    with prime_emulator() as emulator:
        result = run_gsm8k(sim, emulator, tmp_path / "run", "--rollouts", "64")
        assert result["result"]["metrics"]["errors"] == 0
        assert result["result"]["metrics"]["rollouts"] == 64
        assert emulator.left() == []
    assert {r["runtime"] for r in records(tmp_path / "run")} == {"prime"}


def test_a_5_per_s_creation_limit_is_retried_and_counted(sim: Sim, tmp_path: Path) -> None:
    with prime_emulator("--create-rate", "5") as emulator:
        result = run_gsm8k(sim, emulator, tmp_path / "run", "--rollouts", "128")
        refused = emulator.state()["refused"]
        assert emulator.left() == []
    assert result["result"]["metrics"]["errors"] == 0
    retries = sum(r["runtime_retries"] for r in records(tmp_path / "run"))
    assert refused > 0 and retries == refused


def test_stuck_creations_fail_with_runtime_start_and_are_deleted(sim: Sim, tmp_path: Path) -> None:
    with prime_emulator("--stuck", "0.1", "--seed", "4") as emulator:
        result = run_gsm8k(
            sim, emulator, tmp_path / "run", "--rollouts", "64", "--prime-start-timeout", "4"
        )
        assert emulator.left() == []
    failed = [r for r in records(tmp_path / "run") if r["error"]]
    assert failed and result["result"]["metrics"]["errors"] == len(failed)
    assert {(r["error"]["type"], r["error"]["stage"]) for r in failed} == {
        ("runtime_start", "setup")
    }
    assert all("still pending after 4 s" in r["error"]["message"] for r in failed)


def test_credentials_reach_no_record_log_or_sandbox(sim: Sim, tmp_path: Path) -> None:
    out, home = tmp_path / "run", tmp_path / "home"
    home.mkdir()
    with prime_emulator() as emulator:
        result = run_gsm8k(sim, emulator, out, "--rollouts", "4", "-vv", home=home)
        inside = run_cli(["exec", "--runtime", "prime", "--", "sh", "-c",
                          "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"],
                         env={**child_env(), **emulator.env}, timeout=300)  # fmt: skip
        assert emulator.left() == []
    assert inside.returncode == 0, inside.stderr
    assert "PATH=" in inside.stdout
    assert KEY not in inside.stdout and "PRIME_API" not in inside.stdout
    assert KEY not in result["stderr"] and KEY not in json.dumps(result)
    for path in out.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert list(home.rglob("*")) == []  # no gateway token on disk (the SDK's cache file)


def test_sigkill_mid_run_then_cleanup_leaves_nothing(sim_factory: Any, tmp_path: Path) -> None:
    slow = sim_factory("--ttft", "120")
    with prime_emulator() as emulator:
        env = {**child_env(), **emulator.env}
        proc = subprocess.Popen(
            [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", slow.url,
             "--runtime", "prime", "--rollouts", "8", "--no-preflight",
             "--out", str(tmp_path / "run")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while len(emulator.state()["live"]) < 8:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert len(emulator.left()) == 8  # a remote sandbox outlives its run
        cleaned = run_cli(["cleanup", "--runtime", "prime"], env=env, timeout=300)
        assert cleaned.returncode == 0, cleaned.stderr
        assert cleaned.stdout.count("removed prime sandbox") == 8, cleaned.stdout
        assert emulator.left() == []


def test_cleanup_keeps_the_sandboxes_of_a_live_run() -> None:
    async def main() -> None:
        async with create_runtime(runtime_config("prime")) as rt:
            report = await asyncio.to_thread(_cleanup)
            assert [k for k in report.kept if "is alive" in k] and not report.removed
            assert (await rt.run("echo still")).stdout == "still\n"

    with prime_emulator() as emulator, client_env(emulator):
        asyncio.run(main())
        assert emulator.left() == []


def _cleanup() -> Any:
    from metrale.runtime.cleanup import cleanup

    return cleanup(["prime"])


def test_a_start_cancelled_during_the_creation_latency_is_deleted() -> None:
    async def main() -> None:
        rt = create_runtime(runtime_config("prime"))
        start = asyncio.ensure_future(rt.start())
        await asyncio.sleep(1.0)  # the creation is pending in the service
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        await finish(rt.stop())

    with prime_emulator("--create-latency", "3,3") as emulator, client_env(emulator):
        asyncio.run(main())
        assert emulator.left() == []
        time.sleep(3)  # past the latency: nothing starts for a deleted creation
        assert emulator.left() == []


def test_a_start_cancelled_while_backing_off_a_refusal_stops_at_once() -> None:
    async def main() -> float:
        async with create_runtime(runtime_config("prime")):
            rt = create_runtime(runtime_config("prime"))
            start = asyncio.ensure_future(rt.start())
            await asyncio.sleep(1.0)  # refused (429): the SDK waits 10 s before its retry
            start.cancel()
            stopping = time.perf_counter()
            with pytest.raises(asyncio.CancelledError):
                await start
            await finish(rt.stop())
            return time.perf_counter() - stopping

    with prime_emulator("--create-rate", "0.05") as emulator, client_env(emulator):
        assert asyncio.run(main()) < 5
        assert emulator.state()["refused"] >= 1
        assert emulator.left() == []


def test_a_gateway_lost_mid_command_is_runtime_lost() -> None:
    async def main() -> list[str]:
        outcomes = []
        async with create_runtime(runtime_config("prime")) as rt:
            for _ in range(20):
                try:
                    outcomes.append((await rt.run("sleep 0.2; echo done")).stdout)
                except SandboxLostError as exc:
                    assert "gateway was lost mid-command" in str(exc)
                    outcomes.append("lost")
        return outcomes

    with prime_emulator("--gateway-fail", "0.3", "--seed", "2") as emulator:
        with client_env(emulator):
            outcomes = asyncio.run(main())
        assert emulator.left() == []
    assert set(outcomes) == {"done\n", "lost"}, outcomes


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PRIME_API_KEY": ""}, "set PRIME_API_KEY"),
        ({"PRIME_API_BASE_URL": "http://127.0.0.1:9/api/v1"}, "http://127.0.0.1:9 does not answer"),
        ({"PRIME_API_KEY": "wrong"}, "refused PRIME_API_KEY"),
    ],
)
def test_credentials_missing_or_wrong_and_unreachable_are_one_line(
    env: dict[str, str], named: str, tmp_path: Path
) -> None:
    with prime_emulator() as emulator:
        child = {**child_env(), **emulator.env, "HOME": str(tmp_path), **env}
        proc = run_cli(["exec", "--runtime", "prime", "--", "true"], env=child, timeout=120)
        assert emulator.left() == []
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr


def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    shim = tmp_path / "prime_sandboxes"
    shim.mkdir()
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(name='prime_sandboxes')\n")
    env = child_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = run_cli(["exec", "--runtime", "prime", "--", "true"], env=env, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "pip install 'metrale[prime]'" in lines[0]
