"""What only the bwrap sandbox promises: the host's files, home and loopback are out of reach,
processes are bounded, and a server inside is reachable from the next command inside."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metrale.errors import UsageError
from metrale.rollout import RolloutPlan, run_rollouts
from metrale.runtime import Runtime, check_runtime, create_runtime, runtime_config
from metrale.runtime.bwrap import BwrapRuntime
from metrale.runtime.cgroups import SandboxCgroup
from tests.runtime.conftest import HAVE_BWRAP, in_bwrap, processes_with

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host's loopback that counts the connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[object] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        server.close()
    assert not accepted, "the sandbox reached the host's loopback"


def test_writing_outside_the_workdir_fails(marker: str, tmp_path: Path) -> None:
    outside = tmp_path / f"escape-{marker}"

    host_tmp = Path(f"/tmp/{marker}")

    async def body(rt: Runtime) -> None:
        for target in (f"/usr/{marker}", f"/etc/{marker}", f"/{marker}", str(outside)):
            result = await rt.run(f"echo x > {target}")
            assert result.exit_code != 0, target
        private = await rt.run(f"echo x > /tmp/{marker} && cat /tmp/{marker}")
        assert private.stdout == "x\n"  # /tmp inside is private and writable...
        assert not host_tmp.exists()  # noqa: ASYNC240 ...and not the host's

    in_bwrap(body)
    assert not outside.exists()


def test_reading_root_and_the_host_home_fails(marker: str) -> None:
    paths = ("/root", "/root/.bashrc", "/home", os.path.expanduser("~"))

    async def body(rt: Runtime) -> None:
        for path in paths:
            result = await rt.run(f"ls -a {path} || cat {path}")
            assert result.exit_code != 0, path
        home = await rt.run("echo $HOME")
        assert home.stdout.strip() == "/work"

    in_bwrap(body)


def test_tcp_to_the_host_loopback_fails(marker: str, host_server: int) -> None:
    async def body(rt: Runtime) -> None:
        probe = (
            f"import socket; socket.create_connection(('127.0.0.1', {host_server}), timeout=2)"
            "; print('in')"
        )
        result = await rt.run(["python3", "-c", probe], timeout=20)
        assert result.exit_code != 0 and "in" not in result.stdout

    in_bwrap(body)


def test_a_server_inside_is_reachable_from_the_next_command_inside(marker: str) -> None:
    async def body(rt: Runtime) -> None:
        await rt.write("index.html", marker)
        server = await rt.run(
            f"python3 -m http.server 8765 --bind 127.0.0.1 > /dev/null 2>&1 & echo {marker}"
        )
        assert server.exit_code == 0
        fetch = (
            "import time, urllib.request\n"
            "for _ in range(100):\n"
            "    try:\n"
            "        print(urllib.request.urlopen('http://127.0.0.1:8765/index.html').read()"
            ".decode()); break\n"
            "    except OSError: time.sleep(0.05)\n"
        )
        result = await rt.run(["python3", "-c", fetch], timeout=30)
        assert result.stdout.strip() == marker

    in_bwrap(body)


def pids_cgroup_available() -> bool:
    probe = SandboxCgroup.create(f"metrale-probe-{os.getpid()}", max_pids=1, memory_mb=None)
    if probe is None:
        return False
    probe.remove()
    return probe.bounds_pids


@pytest.mark.skipif(
    os.geteuid() == 0 and not pids_cgroup_available(),
    reason="no pids cgroup can be made here, and RLIMIT_NPROC does not bind a root-mapped uid",
)
def test_fork_bomb_is_stopped_by_the_process_limit(marker: str) -> None:
    limit = 24  # bounded on purpose: a shared 2-core machine, 3 s at most

    async def body(rt: Runtime) -> None:
        result = await rt.run(f"b() {{ b | b; }}; b # {marker}", timeout=3)
        assert "fork" in (result.stdout + result.stderr).lower()
        assert not processes_with(marker), "the bomb outlived its timeout"
        await rt.run(f"b() {{ b | b & }}; b # {marker}", timeout=3)  # detached this time
        await asyncio.sleep(1.0)
        assert len(processes_with(marker)) <= limit
        await rt.stop()
        assert not processes_with(marker)

    in_bwrap(body, max_procs=limit)


def test_extra_binds_read_only_and_writable(tmp_path: Path, marker: str) -> None:
    cache = tmp_path / "cache"
    target = tmp_path / "target"
    cache.mkdir()
    target.mkdir()
    (cache / "crate.txt").write_text(marker)

    async def body(rt: Runtime) -> None:
        read = await rt.run("cat /opt/cache/crate.txt")
        assert read.stdout == marker
        denied = await rt.run("echo x > /opt/cache/new")
        assert denied.exit_code != 0
        wrote = await rt.run("echo built > /work/target/out")
        assert wrote.exit_code == 0

    in_bwrap(body, ro_binds=[f"{cache}:/opt/cache"], rw_binds=[f"{target}:/work/target"])
    assert (target / "out").read_text() == "built\n"
    assert not (cache / "new").exists()


def test_host_side_write_does_not_follow_a_sandbox_symlink_out(tmp_path: Path, marker: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")

    async def body(rt: Runtime) -> None:
        await rt.run(f"ln -s {victim} evil")
        with contextlib.suppress(OSError):  # done inside the sandbox, where the link dangles
            await rt.write("evil", marker)

    in_bwrap(body)
    assert victim.read_text() == "original"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_stop_removes_the_workdir_and_the_sandbox(marker: str) -> None:
    async def main() -> None:
        rt = create_runtime(runtime_config("bwrap"))
        assert isinstance(rt, BwrapRuntime)
        await rt.start()
        assert rt.workdir is not None and rt.workdir.is_dir()
        await rt.run(f"sleep {marker} &")
        await rt.stop()
        assert not rt.workdir.exists()
        assert rt.sandbox_pid is not None
        for _ in range(100):  # the sandbox's PID 1 dies of its parent's death, asynchronously
            if not alive(rt.sandbox_pid):
                break
            await asyncio.sleep(0.05)
        assert not alive(rt.sandbox_pid)

    asyncio.run(main())


def test_missing_bind_source_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="does not exist"):
        check_runtime(runtime_config("bwrap", ro_binds=["/nonexistent/cache"]))


def test_missing_bwrap_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="apt-get install bubblewrap"):
        check_runtime(runtime_config("bwrap"))


def test_start_failures_are_retried_and_counted() -> None:
    class Task:
        async def setup(self, ctx: Any) -> None: ...

        async def generate(self, ctx: Any) -> None: ...

        async def score(self, ctx: Any) -> None: ...

    config = runtime_config("bwrap", ro_binds=["/nonexistent/cache"])  # start() fails
    plan = RolloutPlan(
        benchmark="t",
        count=2,
        make_task=lambda i: Task(),
        make_runtime=lambda _index: create_runtime(config),
        runtime_name="bwrap",
        runtime_retries=2,
    )
    records = asyncio.run(run_rollouts(plan))
    for record in records:
        assert record.runtime_retries == 2
        assert record.error is not None and record.error.type == "runtime_start"
        assert record.error.stage == "setup"


def test_a_killed_metrale_leaves_no_sandbox(marker: str) -> None:
    script = (
        "import asyncio, os, signal\n"
        "from metrale.runtime import create_runtime, runtime_config\n"
        "async def main():\n"
        "    rt = create_runtime(runtime_config('bwrap'))\n"
        "    await rt.start()\n"
        f"    await rt.run('sleep {marker} &')\n"
        "    cgroup = rt._cgroup.path if rt._cgroup else ''\n"
        "    print(rt.workdir, cgroup, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], timeout=60, check=False, capture_output=True, text=True
    )
    assert proc.returncode == -9
    # the `marker` fixture checks that the sandbox and its sleep died with it; what a SIGKILL
    # cannot clean up (the workdir, an emptied cgroup) this test removes itself
    workdir, _, cgroup = proc.stdout.strip().partition(" ")
    shutil.rmtree(workdir, ignore_errors=True)
    if cgroup:
        for _ in range(100):
            try:
                os.rmdir(cgroup)
                break
            except OSError:
                time.sleep(0.05)
