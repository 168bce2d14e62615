"""Issue 12 item 6: Ctrl-C or SIGTERM during 64 bwrap starts stops every sandbox that started:
no workdir left in the temp dir, no pids cgroup left."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from tests.conftest import start_sim
from tests.faults.helpers import spawn, stop, wait_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")

PIDS = Path("/sys/fs/cgroup/pids")


def _cgroups() -> set[str]:
    return {p.name for p in PIDS.glob("metrale-bwrap-*")} if PIDS.is_dir() else set()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_64_bwrap_starts_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    # As root, sandboxes run as an unprivileged uid, so their temp dirs go where that uid can
    # pass (pytest's own tmp_path is 0700): a traversable dir of the test's own under /tmp.
    temp = Path(tempfile.mkdtemp(prefix="metrale-faults-", dir="/tmp"))
    temp.chmod(0o711)
    try:
        _signal_during_starts(tmp_path, temp, sig)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _signal_during_starts(tmp_path: Path, temp: Path, sig: signal.Signals) -> None:
    before = _cgroups()
    with start_sim("--ttft", "30") as sim:
        proc = spawn(
            ["run", "gsm8k", "--target", sim.url, "--no-preflight", "--runtime", "bwrap",
             "--max-procs", "64", "--rollouts", "64", "--out", str(tmp_path / "run")],
            env={**os.environ, "TMPDIR": str(temp)},
        )  # fmt: skip
        ours: set[str] = set()  # the run's own sandboxes: other runs on the host make theirs

        def started(n: int) -> bool:
            ours.update(p.name for p in temp.glob("metrale-bwrap-*"))
            return len(ours) >= n

        try:
            wait_for(lambda: started(8), what="8 sandboxes")
        finally:
            os.killpg(proc.pid, sig)
            started(0)
        _, err = stop(proc, timeout=120)
    assert proc.returncode == 130, err
    assert list(temp.glob("metrale-bwrap-*")) == []
    assert (_cgroups() - before) & ours == set()
