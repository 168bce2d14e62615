"""gsm8k through a runtime: a sandbox per rollout, graded inside it, recorded on the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metrale.benchmarks.gsm8k.benchmark import TEXT_ARG_MAX
from tests.conftest import Sim, run_cli, start_sim
from tests.runtime.conftest import HAVE_BWRAP


@pytest.fixture(scope="module")
def answering_sim() -> object:
    with start_sim("--reply", "so the answer is #### 18") as s:
        yield s


@pytest.mark.parametrize(
    "name",
    [
        "subprocess",
        pytest.param(
            "bwrap", marks=pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")
        ),
    ],
)
def test_gsm8k_grades_inside_the_runtime(name: str, answering_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / name
    proc = run_cli(
        ["run", "gsm8k", "--target", answering_sim.url, "--runtime", name, "--rollouts", "6",
         "--max-concurrent", "3", "--seed", "none", "--out", str(out), "--no-preflight",
         "--retries-runtime", "1"],
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 6
    for record in records:
        assert record["error"] is None
        assert record["runtime"] == name
        assert record["metrics"]["parsed"] == "18"  # from the grader's JSON, not in-process
        assert record["metrics"]["grader"] == "awk"  # no interpreter started to score
        assert record["reward"] == (1.0 if record["metrics"]["reference"] == "18" else 0.0)
        assert "setup" in record["stages"] and "scoring" in record["stages"]
    info = json.loads((out / "run.json").read_text())
    assert info["runtime"]["type"] == name
    result = json.loads((out / "result.json").read_text())
    assert result["result"]["metrics"]["runtime_retries"] == 0


def graded_in_bwrap(reply: str, out: Path, *flags: str) -> list[tuple[str, str]]:
    """Two gsm8k rollouts in bwrap against a simulator that answers `reply`: each record's
    (grader, parsed), once none of them failed."""
    with start_sim("--reply", reply) as s:
        proc = run_cli(
            ["run", "gsm8k", "--target", s.url, "--runtime", "bwrap", "--rollouts", "2",
             "--seed", "none", "--out", str(out), "--no-preflight", *flags],
            timeout=180,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["error"] is None for r in records)
    return [(r["metrics"]["grader"], r["metrics"]["parsed"]) for r in records]


@pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")
def test_a_text_awk_declines_is_graded_by_python_in_the_sandbox(tmp_path: Path) -> None:
    assert graded_in_bwrap("résumé: the answer is 18", tmp_path) == [("python", "18")] * 2


@pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")
def test_a_completion_too_long_for_an_argument_is_graded_from_a_file(tmp_path: Path) -> None:
    words = TEXT_ARG_MAX // 5
    reply = "step " * words + "so the answer is #### 18"
    graded = graded_in_bwrap(reply, tmp_path, "--max-tokens", str(words + 10))
    assert graded == [("awk", "18")] * 2


def test_without_a_runtime_grading_stays_in_process(sim: Sim, tmp_path: Path) -> None:
    proc = run_cli(
        ["run", "gsm8k", "--target", sim.url, "--rollouts", "2", "--out", str(tmp_path),
         "--no-preflight"],
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "rollouts.jsonl").read_text().splitlines()[0])
    assert record["runtime"] is None
    assert json.loads((tmp_path / "run.json").read_text())["runtime"] is None
