"""Issue 12 items 10 and 11: counts and exit codes that are true."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import start_sim
from tests.faults.helpers import cli, lines, spawn, stop, wait_for


def test_every_rollout_failed_exits_3_and_says_so(tmp_path: Path) -> None:
    with start_sim("--error-rate", "1", "--error-kinds", "5xx") as sim:
        proc = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight", "--retries", "0",
                    "--rollouts", "8", "--out", str(tmp_path / "run")])  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["exit_code"] == 3
    assert result["result"]["metrics"]["errors"] == 8


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_exits_130_in_the_process_and_in_result_json(
    tmp_path: Path, sig: signal.Signals
) -> None:
    run_dir = tmp_path / "run"
    with start_sim("--ttft", "30") as sim:
        proc = spawn(["run", "gsm8k", "--target", sim.url, "--no-preflight", "--rollouts", "4",
                      "--out", str(run_dir)])  # fmt: skip
        try:
            wait_for(lambda: (run_dir / "run.json").exists(), what="run.json")
            progress = _Stderr(proc)
            wait_for(lambda: progress.has("[rollouts]"), within_s=30, what="rollouts phase")
        finally:
            os.killpg(proc.pid, sig)
        _, err = stop(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 130


class _Stderr:
    """A spawned run's stderr so far, read without blocking: its progress lines name the
    phase."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.text = proc, ""

    def has(self, needle: str) -> bool:
        import select

        assert self.proc.stderr is not None
        while select.select([self.proc.stderr], [], [], 0)[0]:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.text += line
        return needle in self.text


def test_retries_reported_equal_retries_the_sim_received(tmp_path: Path) -> None:
    rollouts, retries = 60, 3
    with start_sim("--error-rate", "0.3", "--error-kinds", "5xx,drop", "--seed", "7") as sim:
        proc = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight",
                    "--retries", str(retries), "--rollouts", str(rollouts), "--max-concurrent", "8",
                    "--out", str(tmp_path / "run")])  # fmt: skip
        assert proc.returncode in (0, 3), proc.stderr
        base = sim.url.removesuffix("/v1")
        with urllib.request.urlopen(base + "/sim/stats", timeout=10) as resp:
            stats = json.loads(resp.read())
    records = lines(tmp_path / "run" / "rollouts.jsonl")
    assert len(records) == rollouts
    # every call's first attempt reached the sim, and each retry is one more request
    sent_retries = stats["requests"] - rollouts
    assert sent_retries > 0
    assert sum(r["retries"] for r in records) == sent_retries
    assert max(r["retries"] for r in records) <= retries
    failed = [r for r in records if r["error"]]
    assert all(r["retries"] == retries for r in failed)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["result"]["metrics"]["retries"] == sent_retries


def test_ray_auto_without_a_cluster_is_a_usage_error_before_any_work(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed")
    if subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True).returncode == 0:
        pytest.skip("a Ray cluster is running on this machine: 'auto' would find it")
    env = {**os.environ, "RAY_ADDRESS": ""}
    with start_sim() as sim:
        proc = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight", "--runtime", "ray",
                    "--ray-address", "auto", "--out", str(tmp_path / "run")], env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "no running Ray cluster" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
