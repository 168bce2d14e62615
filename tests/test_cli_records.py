"""What survives a run that ends badly, and what the command line sends: each test here fails
if one specific safeguard is removed (the flush after each record, the SIGTERM handler, the
API key from the environment)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import run_cli, start_sim_config


def complete_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text()
    return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]


def start_run(url: str, out: Path, rollouts: int, concurrent: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
         "--rollouts", str(rollouts), "--max-concurrent", str(concurrent), "--out", str(out),
         "--no-preflight"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def wait_for_records(proc: subprocess.Popen[str], records: Path, count: int) -> bool:
    """Poll (bounded, 60 s) until `count` whole lines are on disk; False if the run ended first."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(complete_lines(records)) >= count:
            return proc.poll() is None
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_a_sigkilled_run_keeps_every_record_it_wrote_while_running(tmp_path: Path) -> None:
    """Four slow rollouts, one at a time: the first record must be on disk while the other
    three still run (a buffered writer would hold its ~1 KB until the file closes)."""
    with start_sim_config(ttft_s=1.0) as sim:
        proc = start_run(sim.url, tmp_path, rollouts=4, concurrent=1)
        try:
            seen_while_running = wait_for_records(proc, tmp_path / "rollouts.jsonl", 1)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            stop(proc)
    assert seen_while_running, "no record reached the disk while the run was alive"
    assert proc.returncode == -signal.SIGKILL
    lines = complete_lines(tmp_path / "rollouts.jsonl")
    assert 1 <= len(lines) < 4
    for line in lines:
        record = json.loads(line)
        assert record["error"] is None and record["benchmark"] == "gsm8k"
        assert set(record["stages"]) == {"setup", "generation", "scoring"}
    assert not (tmp_path / "result.json").exists()  # it died before writing one


def test_sigterm_ends_the_run_as_interrupted_and_keeps_the_records(tmp_path: Path) -> None:
    with start_sim_config(ttft_s=0.05) as sim:
        proc = start_run(sim.url, tmp_path, rollouts=5000, concurrent=2)
        try:
            assert wait_for_records(proc, tmp_path / "rollouts.jsonl", 3)
            proc.send_signal(signal.SIGTERM)
        finally:
            _, err = stop(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = complete_lines(tmp_path / "rollouts.jsonl")
    assert 3 <= len(lines) < 5000
    assert all(json.loads(line)["error"] is None for line in lines)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["result"]["status"] == "failed"
    assert result["result"]["error"] == "interrupted"


def test_the_api_key_comes_from_the_environment_and_the_flag_wins(tmp_path: Path) -> None:
    """The sim answers 401 without `Authorization: Bearer sk-test`: a CLI that ignored
    OPENAI_API_KEY would stop at the probe."""
    base = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    with start_sim_config(api_key="sk-test") as sim:
        args = ["run", "gsm8k", "--target", sim.url, "--rollouts", "2", "--no-preflight"]
        ok = run_cli([*args, "--out", str(tmp_path / "env"), "--json"],
                     env={**base, "OPENAI_API_KEY": "sk-test"})  # fmt: skip
        missing = run_cli([*args, "--out", str(tmp_path / "none")], env=base)
        flag = run_cli([*args, "--out", str(tmp_path / "flag"), "--api-key", "sk-test"],
                       env={**base, "OPENAI_API_KEY": "sk-wrong"})  # fmt: skip
        wrong = run_cli([*args, "--out", str(tmp_path / "wrong"), "--api-key", "sk-wrong"],
                        env={**base, "OPENAI_API_KEY": "sk-test"})  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["result"]["metrics"]["errors"] == 0
    assert flag.returncode == 0, flag.stderr
    for refused in (missing, wrong):
        assert refused.returncode == 2, refused.stderr
        assert "refused the API key (HTTP 401)" in refused.stderr
        assert "Traceback" not in refused.stderr
