"""`metrale cleanup`: removes the leftovers of dead runs (containers, bwrap workdirs and pids
cgroups), keeps what a live run uses, says what it did, exits 0 when there is nothing to do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.runtime.base import CleanupReport
from metrale.runtime.bwrap_leftovers import clean_bwrap
from metrale.runtime.cgroups import own_cgroup
from tests.runtime.engine import labelled_containers, require_engine


def metrale_cleanup(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metrale", "cleanup", *args],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_nothing_to_do_is_exit_0_even_without_an_engine(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/x.sock", "TMPDIR": str(tmp_path)}
    proc = metrale_cleanup(env=env)
    assert proc.returncode == 0, proc.stderr
    assert "containers not checked" in proc.stdout  # says why docker was not looked at
    # cgroups are host-wide: another run's leftovers may be removed here, and then said
    removed = [line for line in proc.stdout.splitlines() if line.startswith("removed ")]
    assert ("nothing to remove" in proc.stdout) == (not removed)


def test_workdir_of_a_dead_sandbox_goes_one_in_use_stays(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    dead = tmp_path / "metrale-bwrap-dead0001"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "f").write_text("x")
    live = tmp_path / "metrale-bwrap-live0001"
    live.mkdir()
    # a live process naming the workdir in its command line stands for its live bwrap
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(live)])
    cmdline = Path(f"/proc/{holder.pid}/cmdline")
    for _ in range(500):  # until it has exec'd: before that it shows pytest's command line
        if str(live).encode() in cmdline.read_bytes():
            break
        time.sleep(0.01)
    try:
        report = CleanupReport()
        clean_bwrap(report, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert not dead.exists()
    assert live.is_dir()
    # cgroups are machine-wide: another run's orphan may be removed too; the workdirs are ours
    assert [r for r in report.removed if r.startswith("workdir")] == [f"workdir {dead}"]
    assert any(str(live) in k for k in report.kept)
    unrelated = tmp_path / "other-dir"
    unrelated.mkdir()
    clean_bwrap(CleanupReport(), tmp_path)
    assert unrelated.is_dir() and not live.exists()


def test_pids_cgroups_empty_go_busy_stay(sleeper: subprocess.Popen[bytes]) -> None:
    parent = own_cgroup("pids")
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no writable pids cgroup here (bwrap falls back to RLIMIT_NPROC)")
    empty = parent / f"metrale-bwrap-{uuid.uuid4().hex[:8]}"
    busy = parent / f"metrale-bwrap-{uuid.uuid4().hex[:8]}"
    empty.mkdir()
    busy.mkdir()
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        report = CleanupReport()
        clean_bwrap(report, Path("/nonexistent"))
        assert not empty.exists()
        assert busy.exists()
        assert f"cgroup {empty}" in report.removed
        assert any(str(busy) in k for k in report.kept)
    finally:
        # move the sleeper back out so its cgroup can go
        (parent / "cgroup.procs").write_text(str(sleeper.pid))
        for path in (empty, busy):
            if path.exists():
                path.rmdir()


def test_containers_of_dead_runs_go_and_of_live_runs_stay(
    sleeper: subprocess.Popen[bytes],
) -> None:
    require_engine()
    host = socket.gethostname()
    tag = uuid.uuid4().hex[:8]

    def make(pid: int, which: str) -> str:
        argv = ["docker", "run", "-d", "--name", f"metrale-cleanup-{which}-{tag}"]
        argv += ["--label", "metrale.sandbox=1", "--label", f"metrale.sandbox.pid={pid}"]
        argv += ["--label", f"metrale.sandbox.host={host}", "--label", f"test.tag={tag}"]
        argv += ["metrale/base:bookworm", "sleep", "infinity"]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    make(dead_pid(), "dead")
    make(sleeper.pid, "live")
    try:
        proc = metrale_cleanup()
        assert proc.returncode == 0, proc.stderr
        assert f"removed container metrale-cleanup-dead-{tag}" in proc.stdout
        assert f"kept container metrale-cleanup-live-{tag}" in proc.stdout
        assert len(labelled_containers(**{"test.tag": tag})) == 1
        sleeper.kill()
        sleeper.wait()  # its run is over now
        again = metrale_cleanup()
        assert f"removed container metrale-cleanup-live-{tag}" in again.stdout
        assert labelled_containers(**{"test.tag": tag}) == []
    finally:
        left = labelled_containers(**{"test.tag": tag})
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True)


def test_a_sandbox_being_started_by_a_live_run_is_kept(tmp_path: Path) -> None:
    """Before its bwrap runs, a starting sandbox's workdir is named only by its run's pid."""
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "metrale"])
    cmdline = Path(f"/proc/{run.pid}/cmdline")
    for _ in range(500):  # until it has exec'd: before that it shows pytest's command line
        if b"metrale" in cmdline.read_bytes():
            break
        time.sleep(0.01)
    try:
        starting = tmp_path / f"metrale-bwrap-{run.pid}-abcd1234"
        starting.mkdir()
        report = CleanupReport()
        clean_bwrap(report, tmp_path)
        assert starting.is_dir() and any(str(starting) in k for k in report.kept)
    finally:
        run.kill()
        run.wait()
    report = CleanupReport()
    clean_bwrap(report, tmp_path)  # its run is gone now: a leftover
    assert not starting.exists() and f"workdir {starting}" in report.removed
