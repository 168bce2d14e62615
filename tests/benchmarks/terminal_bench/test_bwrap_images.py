"""terminal_bench on bwrap over real task images that attack the host-side preparation: a
WORKDIR that is a chain of links out of the image to a host directory, a WORKDIR holding a
character device and a FIFO, and a WORKDIR the image never creates. Through the real command
line, the real engine and real bwrap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.benchmarks.terminal_bench.helpers import write_task
from tests.benchmarks.terminal_bench.test_benchmark import run_task
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.engine import require_engine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed"),
]

#: test.sh, run in the WORKDIR: reward 1 when the workdir is what the case expects.
TEST = "#!/bin/bash\nmkdir -p /logs/verifier\nif {check}; then r=1; else r=0; fi\n" \
       "echo $r > /logs/verifier/reward.txt\nls -la; pwd\n"  # fmt: skip


@pytest.fixture(autouse=True)
def engine() -> None:
    require_engine()


def test_a_workdir_linking_out_of_the_image_copies_nothing_of_the_host(tmp_path: Path) -> None:
    secret_dir = tmp_path / "host" / "srv" / "x"
    secret_dir.mkdir(parents=True)
    secret = secret_dir / "secret.txt"
    secret.write_text("host secret\n")
    secret.chmod(0o600)
    up = "../" * 12
    dockerfile = (
        "FROM debian:bookworm\nWORKDIR /app\n"
        f"RUN cd / && rmdir /app && ln -s {up}proc/self/root{secret_dir} /c && ln -s c /b "
        "&& ln -s b /app\n"
    )
    task = write_task(tmp_path / "t", dockerfile=dockerfile, solution="#!/bin/bash\ntrue\n",
                      test=TEST.format(check="[ ! -e secret.txt ]"))  # fmt: skip
    done = run_task(task, tmp_path / "run", "--runtime", "bwrap")
    # whatever became of the rollout, the host's 0600 file was neither copied nor handed over
    st = secret.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.getuid(), 0o600)
    for record in done["records"]:
        assert record["reward"] == 1.0 or record["error"]["type"] == "runtime_start", record
        assert "secret" not in str(record["metrics"].get("verifier_output", ""))


def test_fifos_in_the_workdir_are_skipped_and_named(tmp_path: Path) -> None:
    # No device node here: metrale's builder runs podman in a user namespace of its own, where
    # the kernel refuses mknod of a device, so no image it builds can hold one (a `RUN mknod`
    # fails the build). The seed's handling of a real device node is
    # tests/runtime/test_bwrap_seed.py::test_devices_and_fifos_are_skipped_with_a_reason_...
    dockerfile = (
        "FROM debian:bookworm\nRUN mkdir -p /srv/w && echo ok > /srv/w/ok.txt "
        "&& mkfifo /srv/w/fifo\nWORKDIR /srv/w\n"
    )
    check = '[ "$(cat ok.txt)" = ok ] && [ ! -e fifo ]'
    task = write_task(tmp_path / "t", dockerfile=dockerfile, solution="#!/bin/bash\ntrue\n",
                      test=TEST.format(check=check))  # fmt: skip
    done = run_task(task, tmp_path / "run", "--runtime", "bwrap")
    (record,) = done["records"]
    assert record["error"] is None and record["reward"] == 1.0, record
    assert record["metrics"]["workdir_skipped"] == ["fifo: a FIFO, not copied"]


def test_a_workdir_the_image_never_creates_is_made_empty_as_docker_does(tmp_path: Path) -> None:
    dockerfile = "FROM debian:bookworm\nWORKDIR /gone\nRUN cd / && rmdir /gone\n"
    task = write_task(tmp_path / "t", dockerfile=dockerfile, solution="#!/bin/bash\ntrue\n",
                      test=TEST.format(check='[ "$(pwd)" = /gone ]'))  # fmt: skip
    for runtime in ("bwrap", "docker"):
        done = run_task(task, tmp_path / f"run-{runtime}", "--runtime", runtime)
        (record,) = done["records"]
        assert record["error"] is None and record["reward"] == 1.0, (runtime, record)
