"""Nothing is swallowed silently: what metrale used to drop without a word (a second failure of a
rollout that already failed, a result file it could not read, a cgroup it could not remove) is
logged on the `metrale` loggers, where `metrale -v` shows it."""

import logging
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_rollout import Ledger, TornDown, plan, run


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    mine = [r for r in caplog.records if r.name.startswith("metrale")]
    return [r.getMessage() for r in mine if r.levelno == level]


def test_a_stop_failure_after_the_rollouts_own_error_is_logged(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="metrale"):
        [failed] = run(plan(Ledger(), fail_stop=True, fail="scoring"))
    assert failed.error is not None and failed.error.type == "Boom"  # the first error stays
    assert messages(caplog, logging.WARNING) == [
        "rollout 0: runtime stop failed: RuntimeError('teardown failed')"
    ]


def test_a_stop_failure_that_is_the_rollouts_error_is_not_logged_again(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="metrale"):
        [clean] = run(plan(Ledger(), fail_stop=True))
    assert clean.error is not None and clean.error.type == "runtime_stop"
    assert messages(caplog, logging.WARNING) == []


def test_a_teardown_failure_after_the_rollouts_own_error_is_logged(caplog) -> None:
    ledger = Ledger()
    p = plan(ledger, count=2)
    p.make_task = lambda i: TornDown(ledger, i, fail="generation")
    with caplog.at_level(logging.WARNING, logger="metrale"):
        records = run(p)
    assert [r.error.type for r in records if r.error is not None] == ["Boom", "Boom"]
    assert sorted(messages(caplog, logging.WARNING)) == [
        "rollout 0: teardown failed: ValueError('cleanup failed')",
        "rollout 1: teardown failed: ValueError('cleanup failed')",
    ]


def test_a_failed_rollouts_traceback_is_a_debug_line(caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="metrale"):
        [failed] = run(plan(Ledger(), fail="generation"))
    assert failed.error is not None
    [record] = [r for r in caplog.records if r.getMessage() == "rollout 0 failed in generation"]
    assert record.levelno == logging.DEBUG and record.exc_info is not None
    assert str(record.exc_info[1]) == "generation broke"


def test_an_unreadable_summary_is_one_line_naming_it(sim, tmp_path: Path) -> None:
    """A run directory may come from anyone: a broken file in it is refused in one line that
    names it (exit 2), never read around in silence nor shown as a traceback."""
    run_dir = tmp_path / "run"
    made = run_cli(["run", "gsm8k", "--target", sim.url, "--rollouts", "3", "--out", str(run_dir)])
    assert made.returncode == 0, made.stderr
    (run_dir / "summary.json").write_text("{not json")
    proc = run_cli(["-v", "report", str(run_dir)])
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert str(run_dir / "summary.json") in line and "Traceback" not in proc.stderr
