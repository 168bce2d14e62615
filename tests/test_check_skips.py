"""The CI skip check: an allowed skip passes, any other skip fails the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import check_skips

ALLOW = """
[[allow]]
test = "tests/runtime/test_subprocess.py::test_fork_bomb*"
reason = "RLIMIT_NPROC does not bind uid 0*"
why = "root"
"""


def ledger(tmp_path: Path, *skips: tuple[str, str]) -> Path:
    path = tmp_path / "skips"
    entries = [{"test": t, "reason": r} for t, r in skips]
    path.write_text(json.dumps({"collected": 9, "exitstatus": 0, "skips": entries}))
    return path


def run(tmp_path: Path, *skips: tuple[str, str], allow: str = ALLOW) -> int:
    allowed = tmp_path / "allowed.toml"
    allowed.write_text(allow)
    return check_skips.main(["--ledger", str(ledger(tmp_path, *skips)), "--allowed", str(allowed)])


def test_an_allowed_skip_passes_and_no_skip_passes(tmp_path: Path) -> None:
    fork = (
        "tests/runtime/test_subprocess.py::test_fork_bomb_x",
        "RLIMIT_NPROC does not bind uid 0",
    )
    assert run(tmp_path, fork) == 0
    assert run(tmp_path) == 0


def test_a_skip_not_on_the_list_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docker = ("tests/runtime/test_docker.py::test_run", "no docker engine: not found")
    assert run(tmp_path, docker) == 1
    assert (
        "not allowed to skip here: tests/runtime/test_docker.py::test_run"
        in capsys.readouterr().err
    )
    # the right test with another reason is not allowed either
    other = ("tests/runtime/test_subprocess.py::test_fork_bomb_x", "bwrap not installed")
    assert run(tmp_path, other) == 1


def test_a_missing_ledger_or_a_bad_list_is_exit_2(tmp_path: Path) -> None:
    assert check_skips.main(["--ledger", str(tmp_path / "none")]) == 2
    assert run(tmp_path, allow='[[allow]]\ntest = "x"\n') == 2
