"""The project's own checks: mypy is clean on src/ as configured in pyproject.toml,
`scripts/test.sh` runs ruff, ruff format and mypy before any test and stops at the first that
fails with one line naming it, and the wheel ships `py.typed`."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_SH = ROOT / "scripts" / "test.sh"


@pytest.mark.slow
def test_mypy_is_clean_on_src() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Success: no issues found"), proc.stdout


def checks_only() -> str:
    """test.sh's checks, cut out of it: from `check() {` to the last `check ...` line. The rest
    of the script installs system packages and starts the container engine."""
    lines = TEST_SH.read_text().splitlines()
    first = lines.index("check() {")
    last = max(i for i, line in enumerate(lines) if line.startswith("check "))
    return "set -euo pipefail\n" + "\n".join(lines[first : last + 1]) + "\necho CHECKS PASSED\n"


def test_test_sh_checks_lint_format_and_types_before_pytest() -> None:
    lines = TEST_SH.read_text().splitlines()
    order = [
        next(i for i, line in enumerate(lines) if re.match(pattern, line))
        for pattern in (
            r"check .* ruff check src tests$",
            r"check .* ruff format --check src tests$",
            r"check .* mypy$",
            r"eval .*container-engine\.sh up",
            r"python -m pytest ",
        )
    ]
    assert order == sorted(order), order


def copy_of_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".mypy_cache")
    for name in ("src", "tests", "scripts"):
        shutil.copytree(ROOT / name, repo / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    return repo


def run_checks(repo: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-c", checks_only()], cwd=repo, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broken", "append", "failed"),
    [
        ("src/metrale/fmt.py", "import os\n", "ruff check"),
        ("src/metrale/fmt.py", "X = [1,2]\n", "ruff format"),
        ("src/metrale/fmt.py", '\n\nX: int = "one"\n', "mypy"),
        ("tests/test_fmt.py", "import os\n", "ruff check"),
    ],
)
def test_the_first_failing_check_ends_the_script_with_one_line_naming_it(
    tmp_path: Path, broken: str, append: str, failed: str
) -> None:
    repo = copy_of_repo(tmp_path)
    with (repo / broken).open("a") as f:
        f.write(append)
    proc = run_checks(repo)
    assert proc.returncode == 1
    assert "CHECKS PASSED" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"scripts/test.sh: {failed}"), proc.stderr
    assert last.count("failed") == 1


@pytest.mark.slow
def test_the_checks_pass_on_the_tree_as_it_is(tmp_path: Path) -> None:
    proc = run_checks(copy_of_repo(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("CHECKS PASSED")


@pytest.mark.slow
@pytest.mark.real  # pip builds a wheel in a child process: minutes, not the fast set
def test_the_wheel_ships_py_typed(tmp_path: Path) -> None:
    """PEP 561: a type checker reads an installed package's annotations only when it holds
    `py.typed`; it must be in the wheel, not only in the source tree."""
    repo = copy_of_repo(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
         str(repo)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [wheel] = (tmp_path / "dist").glob("metrale-*.whl")
    assert "metrale/py.typed" in zipfile.ZipFile(wheel).namelist()
