"""The `real` marker (tests/real_parts.py): applied by fixture, path and parameter, and a test
that starts a real part without it fails, whether it starts it itself or through a child."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import run_cli, start_sim
from tests.real_parts import REAL, is_real, runs_cli, spawnwatch

LOG_VARIABLE = spawnwatch.LOG_VARIABLE

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class FakeItem:
    path: Path
    name: str
    fixturenames: list[str] = field(default_factory=list)
    marked: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.marked and name == REAL else None


@pytest.mark.parametrize(
    ("path", "name", "fixtures", "marked", "real"),
    [
        ("tests/test_stats.py", "test_percentile", [], False, False),
        ("tests/test_stats.py", "test_percentile", [], True, True),
        ("tests/runtime/test_bwrap.py", "test_anything", [], False, True),
        ("tests/runtime/test_exec.py", "test_exec[bwrap]", [], False, True),
        ("tests/runtime/test_exec.py", "test_exec[subprocess]", [], False, False),
        ("tests/runtime/test_conformance.py", "test_x[ray-bwrap]", [], False, True),
        ("tests/runtime/test_conformance.py", "test_x[docker-64]", [], False, True),
        ("tests/matrix/test_sweep.py", "test_y", ["tmp_path", "warm_cargo"], False, True),
        ("tests/runtime/test_escapes.py", "test_z[host]", ["bwrap_root"], False, True),
    ],
    ids=lambda v: "" if isinstance(v, list | bool) else str(v).replace("/", ".").replace("-", "."),
)
def test_the_marker_is_applied_by_fixture_path_and_parameter(
    path: str, name: str, fixtures: list[str], marked: bool, real: bool
) -> None:
    item = FakeItem(ROOT / path, name, fixtures, marked)
    assert is_real(item, ROOT) is real  # type: ignore[arg-type]


INNER = """
import subprocess, sys
import pytest

BWRAP = {bwrap!r}
PYTHON = {python!r}

def test_starts_bwrap_unmarked():
    subprocess.run([BWRAP, "--version"], check=True)

@pytest.mark.real
def test_starts_bwrap_marked():
    subprocess.run([BWRAP, "--version"], check=True)

def test_a_child_starts_bwrap_unmarked():
    code = f"import subprocess; subprocess.run([{{BWRAP!r}}], check=True)"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_a_child_runs_llama_cpp_unmarked():
    subprocess.run([PYTHON, "-m", "llama_cpp.server"], check=True)

def test_a_shell_runs_the_command_line_unmarked():
    subprocess.run(["sh", "-c", f"exec {{sys.executable}} -m metrale --version"], check=True)

def test_starts_only_a_shell():
    subprocess.run(["sh", "-c", "true"], check=True)

def test_swallows_what_it_started():
    try:
        subprocess.run([BWRAP, "--fail"], check=True)
    except subprocess.CalledProcessError:
        pass
"""


def test_a_test_that_starts_a_real_part_without_the_marker_fails(tmp_path: Path) -> None:
    """A stand-in `bwrap` (a script: the check goes by the program's name, so this runs on a
    machine without bubblewrap) started by the test, by a Python child, or started and its
    failure swallowed; `python -m llama_cpp.server` (a stand-in python) started by the test."""
    bwrap = tmp_path / "bin" / "bwrap"
    bwrap.parent.mkdir()
    bwrap.write_text('#!/bin/sh\n[ "$1" = --fail ] && exit 1\nexit 0\n')
    bwrap.chmod(0o755)
    python = tmp_path / "bin" / "python-stand-in"  # a python by its name: no model is loaded
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    inner = INNER.format(bwrap=str(bwrap), python=str(python))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(inner))
    # the inner session watches its own tests; this test's watch must not see them
    env = {k: v for k, v in os.environ.items() if k != LOG_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.real_parts",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null",
         str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    out = done.stdout
    outcome = {}
    for line in out.splitlines():
        for word in ("PASSED", "ERROR", "FAILED"):
            if line.startswith(word + " "):
                test = line.split("::", 1)[1].split(" ", 1)[0]
                if outcome.get(test) != "failed":  # passed its call, failed its teardown
                    outcome[test] = "failed" if word != "PASSED" else "passed"
    assert outcome == {
        "test_starts_bwrap_unmarked": "failed",
        "test_starts_bwrap_marked": "passed",
        "test_a_child_starts_bwrap_unmarked": "failed",
        "test_a_child_runs_llama_cpp_unmarked": "failed",
        "test_a_shell_runs_the_command_line_unmarked": "failed",
        "test_starts_only_a_shell": "passed",
        "test_swallows_what_it_started": "failed",
    }, out[-3000:]
    assert "starts a real part but is not marked `real`: bwrap" in out
    assert "llama.cpp" in out


def _runs_a_report() -> None:
    run_cli(["report", "nowhere"])


def _helper_of_a_helper() -> None:
    _runs_a_report()


def _runs_a_shim(tmp: Path) -> None:
    (tmp / "metrale").write_text(f'#!/bin/sh\nexec {sys.executable} -m metrale "$@"\n')


def _starts_the_sim_only() -> None:
    with start_sim("--ttft", "0.1"):
        pass


def test_a_test_that_reaches_the_command_line_is_found_by_its_code() -> None:
    """The command line through `run_cli` (or a helper of a helper) makes a test `real`; the
    simulator alone (`metrale sim`, the test double) does not."""
    assert runs_cli(_runs_a_report) and runs_cli(_helper_of_a_helper) and runs_cli(_runs_a_shim)
    assert not runs_cli(_starts_the_sim_only)
