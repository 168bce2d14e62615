"""terminal_bench end to end through the real `metrale` command line, real engine, real bwrap:
a task written here (not shipped) scored by its oracle, a wrong and a cheating solution, each
typed error on the rollout while the run goes on, bad input as one line and exit 2, the
matrix over docker and bwrap, and the model agent against `metrale sim --replay`."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.terminal_bench.helpers import DOCKERFILE, RIGHT, WRONG, write_task
from tests.conftest import start_sim
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.engine import labelled_containers, require_engine

pytestmark = pytest.mark.slow
REPLAYS = resources.files("metrale.benchmarks.terminal_bench").joinpath("replays")


@pytest.fixture(autouse=True)
def engine() -> None:
    require_engine()


def metrale(*args: str, timeout: float = 300) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run the real command line; returns its pid too (its containers carry it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.pid, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_task(task: Path, out: Path, *flags: str, agent: str = "oracle") -> dict[str, Any]:
    pid, done = metrale(
        "run", "terminal_bench", "-p", f"task={task}", "-p", f"agent={agent}",
        "--out", str(out), "--json", *flags,
    )  # fmt: skip
    assert done.stdout, done.stderr
    assert not labelled_containers(**{"metrale.sandbox.pid": str(pid)}), "a container is left"
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return {"code": done.returncode, "stderr": done.stderr, "records": records,
            **json.loads(done.stdout)}  # fmt: skip


def test_an_unseen_task_scores_1_on_4_rollouts_2_at_a_time_and_a_wrong_one_0(
    tmp_path: Path,
) -> None:
    flags = ("--runtime", "docker", "--rollouts", "4", "--max-concurrent", "2")
    right = run_task(write_task(tmp_path / "a"), tmp_path / "right", *flags)
    assert right["code"] == 0, right["stderr"]
    assert [r["reward"] for r in right["records"]] == [1.0] * 4
    assert all(r["error"] is None for r in right["records"])
    assert right["result"]["metrics"]["errors"] == 0
    assert right["result"]["metrics"]["reward_mean"] == 1.0
    for record in right["records"]:
        assert set(record["stages"]) == {"setup", "generation", "scoring"}
        assert record["metrics"]["agent"] == "oracle" and record["metrics"]["timeout"] is None
        assert "PASS" in record["metrics"]["verifier_output"]
    # two at a time: some two rollouts overlap, no three do
    spans = [(r["stages"]["setup"]["start_s"], r["stages"]["scoring"]["end_s"])
             for r in right["records"]]  # fmt: skip
    overlaps = [sum(1 for s, e in spans if s < t < e) for t in (s for s, _ in spans)]
    assert max(overlaps) <= 1 and any(n == 1 for n in overlaps)

    wrong = run_task(write_task(tmp_path / "b", solution=WRONG), tmp_path / "wrong", *flags)
    assert [r["reward"] for r in wrong["records"]] == [0.0] * 4
    assert wrong["result"]["metrics"]["errors"] == 0


def test_what_the_agent_plants_in_tests_or_logs_cannot_score(tmp_path: Path) -> None:
    cheat = (
        "#!/bin/bash\nmkdir -p /logs/verifier /tests\necho 1 > /logs/verifier/reward.txt\n"
        "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh\n"
        "echo 7 > sums.txt\n"
    )
    done = run_task(write_task(tmp_path, solution=cheat), tmp_path / "run", "--runtime", "docker")
    assert [r["reward"] for r in done["records"]] == [0.0]


ERROR_CASES = {
    "no_reward": {"test": "#!/bin/bash\necho ran but wrote nothing\n"},
    "bad_reward": {"test": "#!/bin/bash\nmkdir -p /logs/verifier\necho yes > "
                   "/logs/verifier/reward.txt\n"},
    "verifier_timeout": {"test": "#!/bin/bash\nsleep 30\n", "verifier_timeout": 1},
    "agent_timeout": {"solution": "#!/bin/bash\n" + RIGHT.split("\n", 1)[1] + "sleep 30\n",
                      "agent_timeout": 1},
    "image_build": {"dockerfile": "FROM debian:bookworm\nRUN echo broken >&2; exit 3\n"},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(ERROR_CASES))
def test_each_failure_is_typed_on_the_rollout_and_the_run_goes_on(
    tmp_path: Path, kind: str
) -> None:
    task = write_task(tmp_path, **ERROR_CASES[kind])  # type: ignore[arg-type]
    done = run_task(task, tmp_path / "run", "--runtime", "docker", "--rollouts", "2")
    assert len(done["records"]) == 2, done["stderr"]
    for record in done["records"]:
        assert record["error"] is not None and record["error"]["type"] == kind, record["error"]
    if kind == "agent_timeout":  # the verifier still scored what the agent had done
        assert [r["reward"] for r in done["records"]] == [1.0, 1.0]
        assert all(r["metrics"]["timeout"] == "agent" for r in done["records"])
        assert all(r["error"]["stage"] == "generation" for r in done["records"])
    else:
        assert all(r["reward"] is None for r in done["records"])
    if kind == "verifier_timeout":
        assert all(r["metrics"]["timeout"] == "verifier" for r in done["records"])
    assert done["code"] == 3  # every rollout failed


def _broken_task(tmp_path: Path, how: str) -> Path:
    task = write_task(tmp_path)
    if how == "no-instruction":
        (task / "instruction.md").unlink()
    elif how == "bad-toml":
        (task / "task.toml").write_text("version = \n")
    elif how == "no-test":
        (task / "tests" / "test.sh").unlink()
    elif how == "absent-base":
        (task / "environment" / "Dockerfile").write_text("FROM node:22-nowhere\n")
    return task


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("no-instruction", "instruction.md is missing"),
        ("bad-toml", "task.toml: not valid TOML"),
        ("no-test", "tests/test.sh is missing"),
        ("absent-base", "'node:22-nowhere' is not present locally"),
    ],
)
def test_bad_task_dirs_exit_2_with_one_line(tmp_path: Path, how: str, expected: str) -> None:
    task = _broken_task(tmp_path, how)
    _, done = metrale("run", "terminal_bench", "-p", f"task={task}", "-p", "agent=oracle",
                      "--runtime", "docker", "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    if how == "absent-base":
        assert "--base-image NAME=LOCAL" in lines[0]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--runtime", "subprocess"], "container"),
        (["--runtime", "ray", "--ray-address", "local"], "--ray-inner bwrap|docker"),
        (["--runtime", "docker", "--image", "debian:bookworm"], "--image debian:bookworm"),
    ],
)
def test_runtimes_a_task_cannot_use_are_refused_in_one_line(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    _, done = metrale("run", "terminal_bench", "-p", "agent=oracle", *flags,
                      "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_a_base_image_mapping_builds_from_the_local_image(tmp_path: Path) -> None:
    task = write_task(tmp_path, dockerfile=DOCKERFILE.replace("debian:bookworm", "py:none"))
    done = run_task(task, tmp_path / "run", "--runtime", "docker",
                    "-p", "base_image=py:none=metrale/base:bookworm")  # fmt: skip
    assert [r["reward"] for r in done["records"]] == [1.0], done["stderr"]


@pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")
def test_the_oracle_matrix_over_docker_and_bwrap_writes_8_cells_of_reward_1(
    tmp_path: Path,
) -> None:
    out = tmp_path / "matrix"
    pid, done = metrale(
        "matrix", "terminal_bench", "-p", "task=fix-git", "-p", "agent=oracle",
        "--runtime", "docker,bwrap", "--rollouts", "4,8", "--max-concurrent", "none,4",
        "--out", str(out), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not labelled_containers(**{"metrale.sandbox.pid": str(pid)})
    cells = sorted(out.glob("*.json"))
    cells = [c for c in cells if c.name != "matrix.json"]
    assert len(cells) == 8, [c.name for c in cells]
    for cell in cells:
        data = json.loads(cell.read_text())
        assert data["errors"] == 0 and data["reward_mean"] == 1.0, cell.name
    _, report = metrale("report", str(out))
    assert report.returncode == 0, report.stderr
    names = {f"{rt}-r{n}{c}" for rt in ("docker", "bwrap") for n in (4, 8) for c in ("", "-c4")}
    assert {c.stem for c in cells} == names
    rows = [line.split("|")[1].strip() for line in report.stdout.splitlines()[2:]]
    assert sorted(rows) == sorted(names), report.stdout


def test_the_model_agent_solves_fix_git_from_a_recorded_trajectory(tmp_path: Path) -> None:
    with start_sim("--replay", str(REPLAYS.joinpath("fix-git.jsonl"))) as sim:
        done = run_task(
            Path("fix-git"), tmp_path / "run", "--runtime", "docker", "--rollouts", "2",
            "--max-concurrent", "2", "--target", sim.url, "--no-preflight", agent="model",
        )  # fmt: skip
    assert done["code"] == 0, done["stderr"]
    for record in done["records"]:
        assert record["reward"] == 1.0, record["metrics"].get("verifier_output")
        assert record["turns"] == 9 and record["metrics"]["tool_calls"] == 8
        assert record["metrics"]["exit_status"] == "submitted"
        assert record["tokens"]["completion"] > 0
    transcript = [
        json.loads(line) for line in (tmp_path / "run" / "transcripts" / "0.jsonl").open()
    ]
    assert transcript[1]["content"].startswith("I keep a small static website")
    assert any(m["role"] == "tool" and "CONFLICT" in m["content"] for m in transcript)


def test_reward_json_named_rewards_are_kept_and_an_ambiguous_one_is_bad(tmp_path: Path) -> None:
    named = (
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"reward": 0.5, "style": 1}\' > '
        "/logs/verifier/reward.json\n"
    )
    two = (
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"a": 1, "b": 0}\' > '
        "/logs/verifier/reward.json\n"
    )
    done = run_task(write_task(tmp_path / "a", test=named), tmp_path / "named",
                    "--runtime", "docker")  # fmt: skip
    assert [r["reward"] for r in done["records"]] == [0.5]
    assert done["records"][0]["metrics"]["rewards"] == {"reward": 0.5, "style": 1.0}
    bad = run_task(write_task(tmp_path / "b", test=two), tmp_path / "two", "--runtime", "docker")
    assert bad["records"][0]["error"]["type"] == "bad_reward"
    assert "a, b" in bad["records"][0]["error"]["message"]
