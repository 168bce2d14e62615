"""`metrale tasks check`: one line per problem, a count, exit 0 / 1 / 2, and no traceback on
any task directory a generator of malformed tasks can make (thousands at once)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metrale.benchmarks.terminal_bench.check import check_paths, check_task
from metrale.cli import main
from tests.benchmarks.terminal_bench.helpers import write_dataset, write_task

FIXTURES = Path(__file__).parents[2] / "fixtures" / "harbor-tasks"

#: Values of every kind TOML can hold, for fields that expect one kind.
TOML_VALUES = [
    "1", "-1", "0", "1e400", "nan", "inf", "-inf", "1.5", "99999999999999999999",
    '"2G"', '"lots"', '""', "true", "[]", "[1, 2]", "{}", '{ a = "b" }', '"/app"', '"app"',
    '"\\u0000"', "1979-05-27T07:32:00Z", '"1 TB"', '"512mib"',
]  # fmt: skip
KEYS = {
    "agent": ["timeout_sec", "user"],
    "verifier": ["timeout_sec", "env"],
    "solution": ["env"],
    "environment": [
        "build_timeout_sec", "cpus", "memory_mb", "memory", "storage_mb", "allow_internet",
        "docker_image", "workdir", "gpus", "mcp_servers", "gpu_types",
    ],
}  # fmt: skip
SECTIONS = [
    "[[environment.mcp_servers]]\nname = 'm'\n", "agent = 5\n", "[[environment]]\n",
    "version = {}\n", "metadata = 3\n",
]  # fmt: skip
DOCKERFILES = [
    "FROM debian:bookworm\n", "", "RUN true\n", "FROM\n", "FROM --platform=linux/amd64\n",
    "ARG B=python:3.12\nFROM ${B}\n", "FROM a AS b\nFROM b\n", "FROM scratch\n",
    "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nRUN apt-get update\n",
    "FROM x \\\n  AS y\n", "FROM debian:bookworm\nRUN --mount=type=bind,source=/,target=/h ls\n",
    "\x00\x01FROM\n", "FROM debian:bookworm\nWORKDIR rel\nWORKDIR \"/q\"\n",
]  # fmt: skip


def malformed_task(root: Path, name: str, rng: random.Random) -> Path:
    """A task directory broken in one to three random ways (or not at all)."""
    task = write_task(root, name)
    for _ in range(rng.randint(0, 3)):
        how = rng.choice(
            ["drop", "field", "section", "toml", "bytes", "dockerfile", "dir", "link", "empty"]
        )
        rel = rng.choice(["task.toml", "instruction.md", "tests/test.sh",
                          "environment/Dockerfile", "solution/solve.sh"])  # fmt: skip
        target = task / rel
        if how == "drop":
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        elif how == "field":
            section = rng.choice(list(KEYS))
            key = rng.choice(KEYS[section])
            text = f"\n[{section}]\n{key} = {rng.choice(TOML_VALUES)}\n"
            _put(task / "task.toml", _text(task / "task.toml") + text)
        elif how == "section":
            kind = rng.choice(SECTIONS)
            _put(task / "task.toml", kind + _text(task / "task.toml"))
        elif how == "toml":
            _put(task / "task.toml", rng.choice(["[", "x = ", "= 1", "[a]\n[a]\n"]))
        elif how == "bytes":
            _put(target, bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
        elif how == "dockerfile":
            _put(task / "environment" / "Dockerfile", rng.choice(DOCKERFILES))
        elif how == "dir":
            _clear(target)
            target.mkdir(parents=True)
        elif how == "link":
            _clear(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            # a device, a dangling link and a file outside the task: all inside this test's
            # own directory (a link into the host's tree is one write away from harm)
            outside = root / "outside.txt"
            outside.write_text("not the task's")
            target.symlink_to(rng.choice(["/dev/null", root / "missing", outside]))
        elif how == "empty":
            _put(target, "")
    return task


def _clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _put(path: Path, data: str | bytes) -> None:
    """`data` at `path`, whatever was there (a directory, a link, nothing, a missing parent)."""
    _clear(path)
    if path.parent.is_symlink() or (path.parent.exists() and not path.parent.is_dir()):
        _clear(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace") if path.is_file() else ""
    except OSError:
        return ""


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_any_malformed_task_gives_one_line_problems_never_an_exception(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    root = tmp_path_factory.mktemp("gen")
    task = malformed_task(root, f"t{seed}", random.Random(seed))
    found = check_task(task, {}, None)
    for line in [*found.problems, *found.notes]:
        assert line and "\n" not in line and "Traceback" not in line


def test_thousands_of_generated_tasks_check_with_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(26)
    data = tmp_path / "many"
    data.mkdir()
    for i in range(2000):
        malformed_task(data, f"task-{i:04d}", rng)
    code = main(["tasks", "check", str(data)])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "Traceback" not in out + err and not err
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("2000 tasks: ")
    runnable = int(summary.split(": ")[1].split(" runnable")[0])
    assert 0 < runnable < 2000  # the generator leaves some tasks whole


def test_a_dataset_check_names_each_problem_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_dataset(tmp_path)
    (data / "sums-wrong" / "environment" / "Dockerfile").write_text("FROM node:22-nowhere\n")
    assert main(["tasks", "check", str(data)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(ln.startswith("no-toml: ") and "task.toml is missing" in ln for ln in lines)
    assert any(ln.startswith("wants-gpu: ") and "gpus = 1" in ln for ln in lines)
    assert any(ln.startswith("sums-wrong: FROM node:22-nowhere: not mapped") for ln in lines)
    assert lines[-1] == "5 tasks: 2 runnable, 3 not (3 problems); 0 without an oracle solution"
    # a mapping resolves that FROM, as --base-image does for a run
    assert main(["tasks", "check", str(data / "sums-wrong"),
                 "--base-image", "node:*=metrale/base:bookworm"]) == 0  # fmt: skip


def test_third_party_style_tasks_resolve_by_the_default_mapping_and_note_no_oracle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tasks", "check", str(FIXTURES)]) == 0
    out = capsys.readouterr().out
    assert "apt-jq: note: no solution/solve.sh" in out
    assert out.strip().splitlines()[-1].startswith("3 tasks: 3 runnable, 0 not")


def test_bad_input_is_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tasks", "check", str(tmp_path / "absent")]) == 2
    assert main(["tasks", "check", str(tmp_path), "--base-image", "oops"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "is not a directory" in err[0] and "NAME=LOCAL" in err[1]
    assert main(["tasks", "check", str(tmp_path)]) == 2  # an empty directory: no task
    assert check_paths([write_task(tmp_path, "one")], {}).exit_code == 0
