"""The command line, end to end against a real `metrale sim`: results, errors, exit codes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import default_sigint, run_cli


def read_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "nope"], "unknown benchmark 'nope'; available: "),
        (["run", "gsm8k", "--bogus", "3"], "unknown parameter 'bogus'; valid parameters: "),
        (["run", "gsm8k", "--rollouts", "abc"], "parameter rollouts=abc is not an int"),
        (["run", "gsm8k", "--rollouts", "0"], "below its minimum"),
        (["run", "gsm8k", "--temperature", "9"], "above its maximum"),
        (["run", "gsm8k", "-p", "oops"], "-p expects KEY=VALUE"),
        (["run", "gsm8k", "--retries", "-1"], "accepted: an integer 0..1000000"),
        (["run", "gsm8k", "--target", "http://127.0.0.1:9"], "connection refused"),
        (["run", "gsm8k", "--target", "http://bad-host.invalid"], "cannot resolve host"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["sim", "--error-kinds", "boom"], "unknown --error-kinds"),
        (["exec", "--runtime", "none", "--", "true"], "exec needs a sandbox: --runtime "),
    ],
)
def test_bad_input_is_one_line_exit_2_no_traceback(args: list[str], fragment: str) -> None:
    proc = run_cli(args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0]
    assert "Traceback" not in proc.stderr


def test_unknown_model_is_a_usage_error(sim) -> None:
    proc = run_cli(["run", "gsm8k", "--target", sim.url, "--model", "x"], timeout=60)
    assert proc.returncode == 2
    assert "model 'x' is not served" in proc.stderr


def test_list_shows_parameters_types_and_defaults() -> None:
    proc = run_cli(["list"])
    assert proc.returncode == 0
    assert "gsm8k" in proc.stdout
    assert "--max-concurrent" in proc.stdout and "int in [1..] or none" in proc.stdout
    listed = json.loads(run_cli(["list", "--json"]).stdout)
    gsm = next(b for b in listed if b["id"] == "gsm8k")
    assert {p["name"]: p["default"] for p in gsm["parameters"]}["rollouts"] == 64


def test_run_1024_rollouts_end_to_end(sim, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(
        ["run", "gsm8k", "--target", sim.url, "--rollouts", "1024", "--out", str(out), "--json"]
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["result"]["status"] == "completed"
    assert result["result"]["metrics"]["rollouts"] == 1024
    assert result["result"]["metrics"]["errors"] == 0
    for stage in ("setup", "generation", "scoring", "total"):
        assert result["result"]["stages"][stage]["n"] == 1024
    records = read_records(out)
    assert sorted(r["index"] for r in records) == list(range(1024))
    first = records[0]
    assert set(first["stages"]) == {"setup", "generation", "scoring"}
    assert first["tokens"] == {
        "prompt": first["tokens"]["prompt"],
        "completion": 16,
        "source": "usage",
    }
    assert first["reward"] == 0.0 and first["metrics"]["reference"]
    # Problems follow a seeded permutation, wrapping past 1,319: all distinct below that.
    assert len({r["metrics"]["problem"] for r in records}) == 1024
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["model"] == "metrale-sim" and run_info["params"]["rollouts"] == 1024
    assert run_info["metrale_version"]
    saved = json.loads((out / "result.json").read_text())
    assert saved["result"]["metrics"] == result["result"]["metrics"]
    # The human table goes to stderr with --json, so stdout stays parseable.
    assert "generation" in proc.stderr


def test_table_shows_p50_with_p10_p90(sim, tmp_path: Path) -> None:
    proc = run_cli(
        ["run", "gsm8k", "--target", sim.url, "--rollouts", "20", "--out", str(tmp_path)]
    )
    assert proc.returncode == 0
    header, row = proc.stdout.splitlines()[:2]
    names = re.findall(r"(\w+)(?: \((µs|ms|s)\))?", header)
    assert [n for n, _ in names] == ["e2e", "err", "rew", "setup", "generation", "scoring", "total"]
    # every duration column names its one unit; err and rew are counts and a mean
    assert [bool(u) for _, u in names] == [True, False, False, True, True, True, True]
    assert row.count("–") == 4 and row.count("(") == 4
    assert "0.000" not in row and "e-" not in row


def test_an_endpoint_failing_mid_run_is_recorded_and_the_rest_finish(sim_factory, tmp_path) -> None:
    s = sim_factory("--error-rate", "0.3", "--error-kinds", "5xx,drop,malformed", "--seed", "7")
    proc = run_cli(
        ["run", "gsm8k", "--target", s.url, "--rollouts", "200", "--retries", "0",
         "--out", str(tmp_path), "--no-preflight", "--json"]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout)["result"]["metrics"]
    records = read_records(tmp_path)
    failed = [r for r in records if r["error"]]
    assert len(records) == 200
    assert metrics["errors"] == len(failed) and 20 < len(failed) < 110
    assert {r["error"]["type"] for r in failed} == {"http_500", "connection", "malformed_stream"}
    assert all(r["error"]["stage"] == "generation" and r["reward"] is None for r in failed)
    assert all(r["reward"] is not None for r in records if not r["error"])
    assert "failed rollouts:" in proc.stderr


def test_budgets_decide_the_exit_code(sim, tmp_path: Path) -> None:
    budgets = tmp_path / "BENCH.toml"
    budgets.write_text("[gsm8k]\nreward_mean_min = 0.9\ne2e_s_max = 60\n")
    args = ["run", "gsm8k", "--target", sim.url, "--rollouts", "5", "--budgets", str(budgets)]
    proc = run_cli([*args, "--out", str(tmp_path / "a")])
    assert proc.returncode == 1
    assert "FAIL reward_mean = 0 (must be >= 0.9)" in proc.stdout
    assert "PASS e2e_s" in proc.stdout
    budgets.write_text("[gsm8k]\ne2e_s_max = 60\n")
    assert run_cli([*args, "--out", str(tmp_path / "b")]).returncode == 0
    # ./BENCH.toml is picked up without the flag.
    budgets.write_text("[gsm8k]\nerrors_max = -1\n")
    proc = run_cli(
        ["run", "gsm8k", "--target", sim.url, "--rollouts", "2", "--out", "c"], cwd=tmp_path
    )
    assert proc.returncode == 1 and "FAIL errors" in proc.stdout


def test_api_key_is_sent_from_the_environment(sim_factory, tmp_path: Path) -> None:
    """Against a sim that answers 401 without the key: the run passes only if the key from
    OPENAI_API_KEY is sent, and without it the same run fails."""
    s = sim_factory("--require-api-key", "sk-test")
    args = ["run", "gsm8k", "--target", s.url, "--rollouts", "1", "--no-preflight"]
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    proc = run_cli([*args, "--out", str(tmp_path / "with")], env=env)
    assert proc.returncode == 0, proc.stderr
    assert [r["error"] for r in read_records(tmp_path / "with")] == [None]
    env.pop("OPENAI_API_KEY")
    proc = run_cli([*args, "--out", str(tmp_path / "without")], env=env)
    assert proc.returncode != 0


def test_interrupt_keeps_every_finished_rollout(sim_factory, tmp_path: Path) -> None:
    s = sim_factory("--ttft", "0.05")
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", s.url, "--rollouts", "5000",
         "--max-concurrent", "2", "--out", str(tmp_path), "--no-preflight"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip
    records = tmp_path / "rollouts.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        not records.exists() or records.read_text().count("\n") < 3
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = records.read_text().splitlines()
    assert len(lines) >= 3
    assert all(json.loads(line)["error"] is None for line in lines)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["result"]["status"] == "failed" and result["result"]["error"] == "interrupted"


def test_a_closed_pipe_is_not_a_traceback() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=30)
    proc.stderr.close()
    assert "Traceback" not in err and proc.returncode in (0, 141)


def test_plot_on_a_run_without_a_figure_says_so(sim, tmp_path: Path) -> None:
    assert (
        run_cli(
            ["run", "gsm8k", "--target", sim.url, "--rollouts", "2", "--out", str(tmp_path)]
        ).returncode
        == 0
    )
    proc = run_cli(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")])
    assert proc.returncode == 2
    assert "a gsm8k run has no figure of its own" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_e2e_is_one_number_in_run_and_report(sim, tmp_path: Path) -> None:
    """e2e is the work phase (`RunSummary.e2e_s`), printed the same by run and report; the
    whole run's wall clock is result.json's `wall_s`, never called e2e."""
    from metrale.fmt import duration_unit, in_unit

    out = tmp_path / "run"
    proc = run_cli(["run", "gsm8k", "--target", sim.url, "--rollouts", "6", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[:2]
    saved = json.loads((out / "result.json").read_text())
    e2e = saved["result"]["metrics"]["e2e_s"]
    assert "e2e_s" not in saved and saved["wall_s"] >= e2e > 0
    unit = duration_unit([e2e])
    assert header.startswith(f"e2e ({unit})") and row.split()[0] == in_unit(e2e, unit)
    report = run_cli(["report", str(out)])
    assert report.returncode == 0, report.stderr
    cells = [x.strip() for x in report.stdout.splitlines()[2].strip("|").split("|")]
    assert report.stdout.splitlines()[0].split("|")[3].strip() == f"e2e ({unit})"
    assert cells[2] == row.split()[0]  # the same text in both
    assert abs(float(cells[2]) / {"µs": 1e6, "ms": 1e3, "s": 1}[unit] - e2e) <= 0.005 * e2e
