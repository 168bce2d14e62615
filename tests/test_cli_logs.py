"""`metrale -v`: diagnostics on stderr. A benchmark whose cleanup fails is said there (the run
still ends as it would), and a run without `-v` says nothing of it.

The failing benchmark is installed the way any third-party plugin is: an entry point in a
dist-info directory on the child's `PYTHONPATH`.
"""

import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli

PLUGIN = """
from metrale.benchmarks.gsm8k import Gsm8kBenchmark


class CleanupFails(Gsm8kBenchmark):
    async def cleanup(self):
        await super().cleanup()
        raise RuntimeError("the sandbox would not go")
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    where = tmp_path / "plugins"
    dist = where / "cleanup_fails-0.dist-info"
    dist.mkdir(parents=True)
    (where / "cleanup_fails.py").write_text(textwrap.dedent(PLUGIN))
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cleanup-fails\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[metrale.benchmarks]\ncleanup_fails = cleanup_fails:CleanupFails\n"
    )
    path = [str(where), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_failing_cleanup(sim, tmp_path: Path, env: dict[str, str], *flags: str):
    args = [*flags, "run", "cleanup_fails", "--target", sim.url, "--rollouts", "3"]
    return run_cli([*args, "--out", str(tmp_path / "run")], timeout=120, env=env)


def log_lines(stderr: str) -> list[str]:
    levels = ("metrale: info:", "metrale: warning:", "metrale: debug:", "metrale: error:")
    return [line for line in stderr.splitlines() if line.startswith(levels)]


def test_v_shows_a_cleanup_failure_and_the_run_goes_on(sim, tmp_path, plugin_env) -> None:
    proc = run_failing_cleanup(sim, tmp_path, plugin_env, "-v")
    assert proc.returncode == 0, proc.stderr
    assert "metrale: warning: benchmark cleanup failed: RuntimeError: the sandbox would not go" in (
        log_lines(proc.stderr)
    ), proc.stderr
    assert "Traceback" not in proc.stderr  # -v names the exception; -vv shows where it came from
    assert (tmp_path / "run" / "result.json").is_file()


def test_vv_adds_the_traceback(sim, tmp_path, plugin_env) -> None:
    proc = run_failing_cleanup(sim, tmp_path, plugin_env, "-vv")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" in proc.stderr and 'raise RuntimeError("the sandbox would not go")' in (
        proc.stderr
    )


def test_without_v_the_run_stays_quiet(sim, tmp_path, plugin_env) -> None:
    proc = run_failing_cleanup(sim, tmp_path, plugin_env)
    assert proc.returncode == 0, proc.stderr
    assert "would not go" not in proc.stderr
    assert log_lines(proc.stderr) == []


def test_v_goes_before_the_command_and_keeps_the_benchmark_flags(sim, tmp_path) -> None:
    """`-v run gsm8k --rollouts N`: the benchmark's own flags are still known (they are found
    by peeking at the command line before the real parse)."""
    proc = run_cli(
        ["-vv", "run", "gsm8k", "--target", sim.url, "--rollouts", "2", "--out", str(tmp_path)],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
