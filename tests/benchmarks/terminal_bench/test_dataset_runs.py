"""terminal_bench over a dataset, end to end through the real command line and engine: our own
tasks with known oracle outcomes x 4 attempts give the hand-computed pass@1 and pass@4; a
failed build, a GPU task and a directory without task.toml are named in the per-task table
while the others run; Harbor-style third-party tasks (a public base image, test tools
installed from the registries in the build, no solution) run with the nop agent; task.toml's
env tables and workdir reach the oracle and the verifier; the build's CA bundle and network
are the build's own policy. Run under the engine lock (docs/testing.md)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.terminal_bench.helpers import write_dataset
from tests.benchmarks.terminal_bench.test_benchmark import metrale
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.engine import labelled_containers, require_engine

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parents[2] / "fixtures" / "harbor-tasks"


@pytest.fixture(autouse=True)
def engine() -> None:
    require_engine()


def run(dataset: Path, out: Path, *flags: str) -> dict[str, Any]:
    pid, done = metrale(
        "run", "terminal_bench", "-p", f"task={dataset}", "--out", str(out), "--json", *flags,
        timeout=1200,
    )  # fmt: skip
    assert done.stdout, done.stderr
    assert not labelled_containers(**{"metrale.sandbox.pid": str(pid)}), "a container is left"
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    tasks = {t["name"]: t for t in summary["per_task"]}
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "records": records, "summary": summary, "tasks": tasks}  # fmt: skip


def pass_at(task: dict[str, Any], k: int) -> float:
    from metrale.stats import pass_at_k

    value = pass_at_k(len(task["passed"]), int(sum(task["passed"])), k)
    assert value is not None
    return value


def test_own_tasks_x4_give_the_hand_computed_pass_at_k_and_name_what_did_not_run(
    tmp_path: Path,
) -> None:
    data = write_dataset(tmp_path)
    done = run(data, tmp_path / "run", "-p", "agent=oracle", "--attempts", "4",
               "--runtime", "docker", "--max-concurrent", "4")  # fmt: skip
    tasks, records = done["tasks"], done["records"]
    assert len(records) == 12, done["stderr"]  # 3 tasks that can run x 4 attempts
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_task.setdefault(r["metrics"]["task"], []).append(r)
    assert sorted(by_task) == ["build-fails", "sums-right", "sums-wrong"]
    assert all(sorted(r["metrics"]["attempt"] for r in rs) == [0, 1, 2, 3]
               for rs in by_task.values())  # fmt: skip
    # hand-computed: right passes 4 of 4 (pass@1 = 1, pass@4 = 1), wrong 0 of 4 (0, 0)
    assert (pass_at(tasks["sums-right"], 1), pass_at(tasks["sums-right"], 4)) == (1.0, 1.0)
    assert (pass_at(tasks["sums-wrong"], 1), pass_at(tasks["sums-wrong"], 4)) == (0.0, 0.0)
    assert tasks["build-fails"]["errors"] == {"image_build": 4}
    failed = by_task["build-fails"][0]
    assert "metrale-test: this build step fails" in failed["metrics"]["build_log"]
    assert "gpus = 1" in tasks["wants-gpu"]["skipped"]
    assert "task.toml is missing" in tasks["no-toml"]["skipped"]
    assert tasks["wants-gpu"]["attempts"] == 0 and tasks["no-toml"]["attempts"] == 0
    m = done["summary"]["metrics"]
    # dataset: mean over the 3 tasks that ran of (1, 0, 0)
    assert (m["pass_at_1"], m["pass_at_k"], m["tasks_solved"]) == (1 / 3, 1 / 3, 1)
    assert (m["tasks"], m["tasks_skipped"], m["attempts"]) == (5, 2, 4)
    table = done["stderr"] + done["stdout"]
    assert "dataset: 5 tasks (2 skipped) x 4 attempts" in table
    # --strict refuses the same dataset in one line, before any work
    _, strict = metrale("run", "terminal_bench", "-p", f"task={data}", "-p", "agent=oracle",
                        "--strict", "--runtime", "docker")  # fmt: skip
    assert strict.returncode == 2 and "--strict:" in strict.stderr
    assert len(strict.stderr.strip().splitlines()) == 1


def test_third_party_style_tasks_run_with_nop_reward_0_and_no_harness_error(
    tmp_path: Path,
) -> None:
    done = run(FIXTURES, tmp_path / "run", "-p", "agent=nop", "--tasks", "apt-jq,pip-pytest",
               "--attempts", "2", "--max-concurrent", "2", "--runtime", "docker")  # fmt: skip
    assert len(done["records"]) == 4, done["stderr"]
    for r in done["records"]:
        assert r["error"] is None and r["reward"] == 0.0, r
    assert sorted(done["tasks"]) == ["apt-jq", "pip-pytest"]
    assert all(t["attempts"] == 2 and t["errors"] == {} for t in done["tasks"].values())


@pytest.mark.parametrize("runtime", ["docker", "bwrap"])
def test_env_tables_and_workdir_reach_the_oracle_and_the_verifier(
    tmp_path: Path, runtime: str
) -> None:
    if runtime == "bwrap" and not HAVE_BWRAP:
        pytest.skip("bwrap is not installed")
    done = run(FIXTURES / "env-workdir", tmp_path / "run", "-p", "agent=oracle",
               "--rollouts", "2", "--runtime", runtime)  # fmt: skip
    assert [r["reward"] for r in done["records"]] == [1.0, 1.0], done["records"][0]["metrics"]


def _fresh(tmp_path: Path, name: str) -> Path:
    """A copy of a fixture task whose Dockerfile differs by a comment: not in the cache."""
    data = tmp_path / f"data-{name}"
    shutil.copytree(FIXTURES / name, data / name)
    with (data / name / "environment" / "Dockerfile").open("a") as f:
        f.write(f"# {time.time_ns()}\n")
    return data


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--no-build-ca",), "CERTIFICATE_VERIFY_FAILED"),
        (("--no-build-network",), "apt-get update"),
    ],
)
def test_the_build_reaches_the_registries_only_as_its_policy_says(
    tmp_path: Path, flags: tuple[str, ...], expected: str
) -> None:
    done = run(_fresh(tmp_path, "pip-pytest"), tmp_path / "run", "-p", "agent=nop",
               "--runtime", "docker", *flags)  # fmt: skip
    (record,) = done["records"]
    assert record["error"]["type"] == "image_build", record
    assert expected in record["metrics"]["build_log"]
