"""Issue 12 item 7: a killed run is finished by `--resume`; an earlier run is never clobbered."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.conftest import start_sim
from tests.faults.helpers import cli, count_lines, lines, snapshot, spawn, stop, wait_for

ROLLOUTS = 40


def test_sigkilled_run_resumed_ends_with_every_rollout_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with start_sim("--ttft", "0.05") as sim:
        proc = spawn([
            "run", "gsm8k", "--target", sim.url, "--no-preflight", "--out", str(run_dir),
            "--rollouts", str(ROLLOUTS), "--max-concurrent", "2", "--max-tokens", "8",
        ])  # fmt: skip
        try:
            wait_for(lambda: count_lines(run_dir / "rollouts.jsonl") >= 6, what="6 records")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            stop(proc)
        before = lines(run_dir / "rollouts.jsonl")
        assert 6 <= len(before) < ROLLOUTS
        assert not (run_dir / "result.json").exists()

        done = cli(["run", "--resume", str(run_dir), "--no-preflight"])
        assert done.returncode == 0, done.stderr
        records = lines(run_dir / "rollouts.jsonl")
        assert sorted(r["index"] for r in records) == list(range(ROLLOUTS))
        assert records[: len(before)] == before  # appended: the earlier records are untouched
        result = json.loads((run_dir / "result.json").read_text())
        assert result["result"]["status"] == "completed"
        assert result["result"]["metrics"]["rollouts"] == ROLLOUTS
        assert result["exit_code"] == 0

        held = snapshot(run_dir)
        again = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight",
                     "--out", str(run_dir), "--rollouts", "3"])  # fmt: skip
        assert again.returncode == 2
        assert "already holds a run" in again.stderr and "Traceback" not in again.stderr
        assert snapshot(run_dir) == held


def test_torn_last_line_is_dropped_and_rerun(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with start_sim() as sim:
        first = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight", "--out", str(run_dir),
                     "--rollouts", "5", "--max-tokens", "4"])  # fmt: skip
        assert first.returncode == 0, first.stderr
        log = run_dir / "rollouts.jsonl"
        kept = log.read_bytes().splitlines(keepends=True)
        # a crash mid-write: the last record lost, half of it on disk
        log.write_bytes(b"".join(kept[:-1]) + kept[-1][:37])
        lost = json.loads(kept[-1])["index"]
        done = cli(["run", "--resume", str(run_dir), "--no-preflight"])
        assert done.returncode == 0, done.stderr
    records = lines(log)
    assert sorted(r["index"] for r in records) == [0, 1, 2, 3, 4]
    assert records[-1]["index"] == lost


def test_retry_errors_reruns_failed_and_keeps_them_aside(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with start_sim("--error-rate", "0.5", "--error-kinds", "5xx", "--seed", "3") as sim:
        first = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight", "--out", str(run_dir),
                     "--rollouts", "12", "--retries", "0", "--max-tokens", "4"])  # fmt: skip
        failed = [r["index"] for r in lines(run_dir / "rollouts.jsonl") if r["error"]]
        assert failed and first.returncode in (0, 3), first.stderr
        plain = cli(["run", "--resume", str(run_dir), "--no-preflight"])
        assert plain.returncode in (0, 3), plain.stderr
        assert count_lines(run_dir / "rollouts.jsonl") == 12  # nothing was missing: no new run
        done = cli(["run", "--resume", str(run_dir), "--retry-errors", "--no-preflight"])
        assert done.returncode in (0, 3), done.stderr
    records = lines(run_dir / "rollouts.jsonl")
    assert sorted(r["index"] for r in records) == list(range(12))
    moved = lines(run_dir / "retried.jsonl")
    assert sorted(r["index"] for r in moved) == sorted(failed)
    assert all(r["error"] for r in moved)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["result"]["metrics"]["rollouts"] == 12
    assert result["result"]["metrics"]["errors"] == sum(1 for r in records if r["error"])


def test_conflicting_flags_and_bad_out_are_usage_errors(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with start_sim() as sim:
        first = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight", "--out", str(run_dir),
                     "--rollouts", "2", "--max-tokens", "4"])  # fmt: skip
        assert first.returncode == 0, first.stderr
        held = snapshot(run_dir)
        for extra, named in [
            (["--rollouts", "9"], "--rollouts"),
            (["--target", "http://127.0.0.1:9/v1"], "--target"),
            (["serve"], "gsm8k run, not serve"),
            (["--out", str(tmp_path / "x")], "--out"),
            (["--runtime", "subprocess"], "--runtime"),
        ]:
            proc = cli(["run", "--resume", str(run_dir), "--no-preflight", *extra])
            assert proc.returncode == 2, (extra, proc.stderr)
            assert named in proc.stderr and "Traceback" not in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1
        same = cli(["run", "--resume", str(run_dir), "--no-preflight", "--rollouts", "2"])
        assert same.returncode == 0, same.stderr  # repeating a value is no conflict
        rewritten = ("result.json", "summary.json")  # the resumed run's own outcome
        assert {k: v for k, v in snapshot(run_dir).items() if k not in rewritten} == {
            k: v for k, v in held.items() if k not in rewritten
        }
        empty = cli(["run", "gsm8k", "--target", sim.url, "--out", ""])
        assert empty.returncode == 2 and "--out" in empty.stderr
        overwrite = cli(["run", "gsm8k", "--target", sim.url, "--no-preflight",
                         "--out", str(run_dir), "--rollouts", "1", "--overwrite"])  # fmt: skip
        assert overwrite.returncode == 0, overwrite.stderr
        assert [r["index"] for r in lines(run_dir / "rollouts.jsonl")] == [0]


def test_matrix_resume_skips_completed_cells(tmp_path: Path) -> None:
    out = tmp_path / "results"
    with start_sim() as sim:
        args = ["matrix", "gsm8k", "--target", sim.url, "--no-preflight", "--out", str(out),
                "--rollouts", "2,3", "-p", "max_tokens=4"]  # fmt: skip
        first = cli(args)
        assert first.returncode == 0, first.stderr
        cells = sorted(p.name for p in out.glob("*.json"))
        assert len(cells) == 2
        # one cell failed last time: its file says so, and only it is run again
        failed = out / cells[0]
        data = json.loads(failed.read_text())
        data["status"], data["error"] = "failed", "interrupted"
        failed.write_text(json.dumps(data))
        kept = (out / cells[1]).read_bytes()
        kept_run = snapshot(out / "runs" / cells[1].removesuffix(".json"))
        again = cli([*args, "--resume"])
        assert again.returncode == 0, again.stderr
    assert (out / cells[1]).read_bytes() == kept
    assert snapshot(out / "runs" / cells[1].removesuffix(".json")) == kept_run
    assert json.loads(failed.read_text())["status"] == "completed"
