"""Nothing is swallowed silently: what metrale used to drop without a word (a second failure of a
rollout that already failed, a result file it could not read, a cgroup it could not remove) is
logged on the `metrale` loggers, where `metrale -v` shows it."""

import logging
import time
from pathlib import Path

import pytest

from metrale.matrix.execute import _completed_cell
from metrale.matrix.sweep import Cell, Tier
from metrale.runtime.cgroups import _remove
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


def test_an_unreadable_result_is_said_when_a_run_directory_is_read(sim, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    made = run_cli(["run", "gsm8k", "--target", sim.url, "--rollouts", "3", "--out", str(run_dir)])
    assert made.returncode == 0, made.stderr
    (run_dir / "summary.json").write_text("{not json")
    proc = run_cli(["-v", "report", str(run_dir)])
    assert proc.returncode == 0, proc.stderr  # the records still make the table
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("metrale: warning:")]
    assert len(warnings) == 1 and str(run_dir) in warnings[0], proc.stderr
    assert "unreadable result" in warnings[0] and "summarised from its records" in warnings[0]
    assert "unreadable" not in run_cli(["report", str(run_dir)]).stderr  # quiet without -v


def test_an_unreadable_cell_file_is_said_before_the_cell_runs_again(caplog, tmp_path) -> None:
    cell = Cell(
        name="none-r4", tier=Tier("default"), runtime="none", rollouts=4, max_concurrent=None,
        params={},
    )  # fmt: skip
    (tmp_path / f"{cell.name}.json").write_text("{not json")
    with caplog.at_level(logging.INFO, logger="metrale"):
        assert _completed_cell(tmp_path, cell) is None
    [said] = messages(caplog, logging.INFO)
    assert said.startswith(f"{tmp_path / cell.name}.json: unreadable (") and "runs again" in said


def test_a_directory_that_cannot_be_removed_is_said_after_the_retries(caplog, tmp_path) -> None:
    """`_remove` retries a busy cgroup for ~3 s; one that stays (here: a directory that is not
    empty, as a cgroup with a process that will not die refuses `rmdir`) is left with a
    warning, not in silence."""
    busy = tmp_path / "metrale-cg"
    busy.mkdir()
    (busy / "cgroup.procs").write_text("")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="metrale"):
        _remove(busy)
    assert busy.is_dir() and time.monotonic() - started >= 2.5
    assert messages(caplog, logging.WARNING) == [
        f"cgroup {busy} still busy after 3 s: left for 'metrale cleanup'"
    ]


def test_nothing_logs_below_the_cli_level_by_default() -> None:
    """Without `-v` the command line's handler passes errors only."""
    from metrale.cli.logs import configure

    configure(0)
    logger = logging.getLogger("metrale")
    try:
        assert not logger.isEnabledFor(logging.WARNING)
        assert logger.isEnabledFor(logging.ERROR)
        configure(1)
        assert logger.isEnabledFor(logging.INFO) and not logger.isEnabledFor(logging.DEBUG)
        configure(3)
        assert logger.isEnabledFor(logging.DEBUG)
        assert len([h for h in logger.handlers if h.get_name() == "metrale.cli"]) == 1
    finally:
        for handler in [h for h in logger.handlers if h.get_name() == "metrale.cli"]:
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def test_a_broken_levels_file_is_said_and_a_missing_one_is_not(caplog, tmp_path) -> None:
    from metrale.benchmarks.serve.params import LEVELS_FILE
    from metrale.benchmarks.serve.plot import serve_curves

    with caplog.at_level(logging.INFO, logger="metrale"):
        assert serve_curves(tmp_path) == []
        assert messages(caplog, logging.WARNING) == []
        (tmp_path / LEVELS_FILE).write_text('{"levels": "not a list"}')
        assert serve_curves(tmp_path) == []
    [said] = messages(caplog, logging.WARNING)
    assert said.startswith(f"{tmp_path / LEVELS_FILE}: unreadable, no curves: ")
