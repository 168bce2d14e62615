"""`--runtime modal` end to end against `metrale sandbox-sim modal` (bwrap sandboxes behind it):
rollouts against `metrale sim` finish with no error and leave no sandbox, under the service's
faults too (a creation rate limit, stuck creations, a router lost mid-command, a run killed or
cancelled mid-creation), and credentials go nowhere they should not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Sim, run_cli
from tests.faults.helpers import lines, spawn, wait_for
from tests.sandbox_sim.modal_sim import ModalSim, start_modal_sim

pytest.importorskip("modal", reason="the modal extra is not installed")


def _gsm8k(sim: Sim, out: Path, rollouts: int, *extra: str) -> list[str]:
    return ["run", "gsm8k", "--target", sim.url, "--no-preflight", "--rollouts", str(rollouts),
            "--max-tokens", "8", "--runtime", "modal", "--out", str(out), *extra]  # fmt: skip


def _child(script: str, modal_sim: ModalSim, timeout: float = 180) -> Any:
    """Run `script` (asyncio code printing one JSON line last) in a child with the SDK's env."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=timeout, env=modal_sim.child_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gsm8k_64_rollouts_no_error_no_sandbox_left_no_credential_written(
    sim: Sim, tmp_path: Path
) -> None:
    with start_modal_sim() as modal_sim:
        out = tmp_path / "run"
        done = run_cli([*_gsm8k(sim, out, 64), "-vv"], env=modal_sim.child_env())
        assert done.returncode == 0, done.stderr[-3000:]
        records = lines(out / "rollouts.jsonl")
        assert len(records) == 64
        assert [r["error"] for r in records if r["error"]] == []
        assert modal_sim.live() == []
        assert modal_sim.state()["created"] == 64
        secret = modal_sim.env["MODAL_TOKEN_SECRET"]
        for path in out.rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), path
        assert secret not in done.stderr + done.stdout  # the -vv log


def test_the_sandbox_env_holds_no_credential(modal_sim: ModalSim) -> None:
    secret = modal_sim.env["MODAL_TOKEN_SECRET"]
    got = _child(
        """
        import asyncio, json
        from metrale.runtime import create_runtime, runtime_config

        async def main():
            async with create_runtime(runtime_config("modal", env={"GIVEN": "1"})) as rt:
                seen = await rt.run("env; cat /proc/*/environ 2>/dev/null | tr '\\\\0' '\\\\n'")
                print(json.dumps({"out": seen.stdout}))

        asyncio.run(main())
        """,
        modal_sim,
    )
    assert "GIVEN=1" in got["out"]
    assert secret not in got["out"] and "MODAL_TOKEN" not in got["out"]


def test_a_creation_rate_limit_is_retried_and_counted(sim: Sim, tmp_path: Path) -> None:
    with start_modal_sim("--create-rate", "5") as modal_sim:
        out = tmp_path / "run"
        done = run_cli(_gsm8k(sim, out, 64), env=modal_sim.child_env())
        assert done.returncode == 0, done.stderr[-3000:]
        records = lines(out / "rollouts.jsonl")
        assert len(records) == 64 and [r for r in records if r["error"]] == []
        retries = sum(r["runtime_retries"] for r in records)
        assert retries > 0, "no creation was refused and retried"
        assert retries == modal_sim.state()["refused"]
        assert modal_sim.live() == []


STARTS = """
    import asyncio, json, sys
    from metrale.runtime import create_runtime, runtime_config

    async def one(config):
        rt = create_runtime(config)
        try:
            await rt.start()
            return "ok"
        except Exception as exc:
            return getattr(exc, "kind", type(exc).__name__)
        finally:
            await rt.stop()

    async def main():
        config = runtime_config("modal", start_timeout=4)
        kinds = await asyncio.gather(*(one(config) for _ in range(8)))
        print(json.dumps(kinds))

    asyncio.run(main())
"""


def test_stuck_creations_are_runtime_start_errors_and_deleted() -> None:
    with start_modal_sim("--stuck", "0.5", "--seed", "3") as modal_sim:
        kinds = _child(STARTS, modal_sim)
        assert "runtime_start" in kinds and "ok" in kinds, kinds
        assert set(kinds) == {"ok", "runtime_start"}
        assert modal_sim.state()["created"] == 8
        assert modal_sim.live() == []


def test_stuck_rollouts_fail_with_runtime_start_and_nothing_is_left(
    sim: Sim, tmp_path: Path
) -> None:
    with start_modal_sim("--stuck", "0.1", "--seed", "1") as modal_sim:
        out = tmp_path / "run"
        done = run_cli([*_gsm8k(sim, out, 32), "--modal-start-timeout", "4"],
                       env=modal_sim.child_env())  # fmt: skip
        records = lines(out / "rollouts.jsonl")
        assert len(records) == 32, done.stderr[-3000:]
        errors = [r["error"] for r in records if r["error"]]
        assert errors, "no creation was stuck"
        assert {(e["type"], e["stage"]) for e in errors} == {("runtime_start", "setup")}
        assert modal_sim.live() == []


def test_a_router_lost_mid_command_is_runtime_lost() -> None:
    with start_modal_sim("--gateway-fail", "1") as modal_sim:
        got = _child(
            """
            import asyncio, json
            from metrale.runtime import create_runtime, runtime_config

            async def main():
                async with create_runtime(runtime_config("modal")) as rt:
                    try:
                        await rt.run("sleep 2; echo done")
                        print(json.dumps("no error"))
                    except Exception as exc:
                        print(json.dumps(getattr(exc, "kind", repr(exc))))

            asyncio.run(main())
            """,
            modal_sim,
        )
        assert got == "runtime_lost"
        assert modal_sim.live() == []


def test_a_creation_in_flight_when_cancelled_is_terminated() -> None:
    with start_modal_sim("--create-latency", "3,3") as modal_sim:
        got = _child(
            """
            import asyncio, json, os, urllib.request
            from metrale.runtime import create_runtime, runtime_config

            def created():
                url = os.environ["METRALE_SANDBOX_SIM_STATE"]
                with urllib.request.urlopen(url, timeout=10) as r:
                    return json.load(r)["created"]

            async def main():
                rt = create_runtime(runtime_config("modal"))
                starting = asyncio.ensure_future(rt.start())
                # cancelled once the service holds the creation (pending for its 3 s), not
                # after a fixed time: a loaded machine may not have sent it yet
                for _ in range(1200):
                    if await asyncio.to_thread(created) or starting.done():
                        break
                    await asyncio.sleep(0.05)
                starting.cancel()
                try:
                    await starting
                except asyncio.CancelledError:
                    pass
                await rt.stop()
                print(json.dumps("stopped"))

            asyncio.run(main())
            """,
            modal_sim,
        )
        assert got == "stopped"
        assert modal_sim.state()["created"] == 1
        assert modal_sim.live() == []


def test_sigkill_mid_run_then_cleanup_leaves_nothing(tmp_path: Path) -> None:
    with start_modal_sim() as modal_sim, _slow_sim() as slow:
        proc = spawn(_gsm8k(slow, tmp_path / "run", 16), env=modal_sim.child_env())
        try:
            wait_for(lambda: len(modal_sim.live()) >= 4, 120, "live modal sandboxes")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert modal_sim.live(), "the killed run's sandboxes should outlive it"
        done = run_cli(["cleanup", "--runtime", "modal"], env=modal_sim.child_env())
        assert done.returncode == 0, done.stderr
        assert "removed modal sandbox" in done.stdout
        assert modal_sim.live() == []


def _slow_sim() -> Any:
    from tests.conftest import start_sim

    return start_sim("--ttft", "30")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": ""}, "MODAL_TOKEN_ID"),
        ({"MODAL_SERVER_URL": "http://127.0.0.1:9"}, "nothing answers at http://127.0.0.1:9"),
        ({"PYTHONPATH": "{shadow}"}, "pip install 'metrale[modal]'"),
    ],
    ids=["credentials", "unreachable", "extra"],
)
def test_usage_errors_are_one_line_exit_2(env: dict[str, str], says: str, tmp_path: Path) -> None:
    """Missing credentials, an unreachable service, the extra missing: one line, exit 2,
    before any sandbox (nothing answers where the service is said to be)."""
    shadow = tmp_path / "shadow"
    (shadow / "modal").mkdir(parents=True)
    (shadow / "modal" / "__init__.py").write_text("raise ImportError('no modal here')\n")
    config = tmp_path / "modal.toml"
    config.write_text("")
    base = {**os.environ, "MODAL_CONFIG_PATH": str(config), "MODAL_TOKEN_ID": "ak-x",
            "MODAL_TOKEN_SECRET": "as-y", "MODAL_SERVER_URL": "http://127.0.0.1:9"}  # fmt: skip
    given = {k: v.replace("{shadow}", f"{shadow}:{os.environ.get('PYTHONPATH', '')}")
             for k, v in env.items()}  # fmt: skip
    started = time.monotonic()
    done = run_cli(["exec", "--runtime", "modal", "--", "echo", "hi"], env={**base, **given})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert says in done.stderr
    assert time.monotonic() - started < 60
