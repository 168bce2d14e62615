"""Hostile tests, one per class of escape (issue 12): each does what an attacker inside a real
bwrap sandbox would, and checks the host. Each failed on the code before the fix."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from metrale.runtime import Runtime, create_runtime, runtime_config
from metrale.runtime.base import SandboxLostError
from metrale.runtime.bwrap import WORKDIR_PREFIX, BwrapRuntime, leftover_cgroups
from tests.runtime.conftest import HAVE_BWRAP, processes_with

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")

SECRETS = ("OPENAI_API_KEY", "DATABASE_URL", "GH_PAT", "AWS_ACCESS_KEY_ID", "SSH_AUTH_SOCK")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def exists(path: Path) -> bool:
    return path.exists()


def in_runtime(name: str, body: Callable[[Runtime], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        async with create_runtime(runtime_config(name, **options)) as rt:
            return await body(rt)

    return asyncio.run(main())


@pytest.mark.parametrize("name", ["subprocess", "bwrap", "bwrap-image-root"])
def test_no_variable_of_metrales_environment_is_readable_inside(
    name: str, marker: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    options: dict[str, Any] = {}
    if name == "bwrap-image-root":
        name, options = "bwrap", {"root": request.getfixturevalue("image_root")}
    for key in SECRETS:
        monkeypatch.setenv(key, f"planted-{key}-{marker}")
    monkeypatch.setenv("GIVEN", f"given-{marker}")
    # every path a process inside can read: its own env, every /proc/*/environ (PID 1 is a
    # fork of bwrap), a process started by an earlier command, cmdlines
    sweep = (
        "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/task/*/environ /proc/[0-9]*/cmdline;"
        " do cat $f 2>/dev/null; echo; done"
    )

    async def body(rt: Runtime) -> str:
        await rt.run(f"sleep {marker} > /dev/null 2>&1 &")
        result = await rt.run(sweep)
        assert result.exit_code == 0
        return result.stdout

    seen = in_runtime(name, body, env={"GIVEN": os.environ["GIVEN"], "ALSO": "x"}, **options)
    leaked = [key for key in SECRETS if f"planted-{key}-{marker}" in seen]
    assert not leaked, f"readable inside the {name} sandbox: {leaked}"
    assert f"given-{marker}" in seen  # what is passed explicitly does arrive


def test_env_flag_passes_named_variables_and_refuses_unset_ones(marker: str) -> None:
    env = {**os.environ, "FROM_HOST": f"host-{marker}", "OPENAI_API_KEY": f"key-{marker}"}
    env.pop("NOT_SET_ANYWHERE", None)
    base = [sys.executable, "-m", "metrale", "exec", "--runtime", "bwrap"]
    ok = subprocess.run(
        [*base, "--env", "FROM_HOST", "--env", "B=2", "--", "sh", "-c", "env; cat /proc/1/environ"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert f"FROM_HOST=host-{marker}" in ok.stdout and "B=2" in ok.stdout
    assert f"key-{marker}" not in ok.stdout
    bad = subprocess.run(
        [*base, "--env", "NOT_SET_ANYWHERE", "--", "true"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "NOT_SET_ANYWHERE" in bad.stderr and "Traceback" not in bad.stderr


def _euid_on_host_as_nobody(binary: Path) -> str:
    result = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", str(binary), "-u"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return result.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="the root mapping exists only when metrale is root")
def test_a_setuid_file_made_inside_gives_no_privilege_on_the_host(
    marker: str, bwrap_root: dict[str, str]
) -> None:
    shared = Path(tempfile.mkdtemp(prefix="metrale-test-bind-"))
    shared.chmod(0o755)  # so that uid 65534 can reach what the sandbox leaves there
    make = "cp /usr/bin/id {0} && chmod u+s,g+s {0} && ls -ln {0}"
    try:

        async def body(rt: Runtime) -> None:
            assert isinstance(rt, BwrapRuntime)
            for inside in ("/work/idsu", "/shared/idsu"):
                result = await rt.run(make.format(inside))
                assert result.exit_code == 0, result.stderr
            for host in (rt.host_workdir / "idsu", shared / "idsu"):
                st = host.stat()
                assert st.st_uid != 0 and st.st_gid != 0, f"{host} is root-owned"
                assert st.st_uid == rt.host_uid
            assert _euid_on_host_as_nobody(shared / "idsu") != "0"

        in_runtime("bwrap", body, rw_binds=[f"{shared}:/shared"], **bwrap_root)
        kept = shared / "idsu"  # as agentic_webserver keeps sandboxes/<i>/work
        st = kept.stat()
        setuid_root = st.st_uid == 0 and st.st_mode & stat.S_ISUID
        setgid_root = st.st_gid == 0 and st.st_mode & stat.S_ISGID
        assert not setuid_root and not setgid_root
        assert _euid_on_host_as_nobody(kept) != "0"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _spawn_with_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """A host process that has pid `pid` (via ns_last_pid), or None when others took it."""
    for _ in range(20):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(argv)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_after_kill_all_inside_no_command_runs_anywhere(
    marker: str, bwrap_root: dict[str, str], tmp_path: Path
) -> None:
    host_file = tmp_path / f"ran-on-host-{marker}"
    can_steer = os.access("/proc/sys/kernel/ns_last_pid", os.W_OK)

    async def body(rt: Runtime) -> None:
        assert isinstance(rt, BwrapRuntime) and rt.sandbox_pid is not None
        pid = rt.sandbox_pid
        with pytest.raises(SandboxLostError):
            await rt.run("kill -9 -1; sleep 5")
        for _ in range(100):
            if not alive(pid):
                break
            await asyncio.sleep(0.02)
        # the sandbox's pid now belongs to a host process, when this host lets us arrange it
        squatter = _spawn_with_pid(pid, ["sleep", marker]) if can_steer else None
        try:
            for _ in range(5):
                with pytest.raises(SandboxLostError):
                    await rt.run(f"touch {host_file}")
        finally:
            if squatter is not None:
                squatter.kill()
                squatter.wait()

    in_runtime("bwrap", body, **bwrap_root)
    assert not host_file.exists(), "a command after the sandbox died ran on the host"


def test_a_racing_symlink_swap_cannot_steer_read_or_write_out(
    marker: str, bwrap_root: dict[str, str], tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text(f"host secret {marker}")
    created = tmp_path / f"created-{marker}"
    swap = (
        f"i=0; while [ $i -lt 4000 ]; do i=$((i+1)); "
        f"ln -sfn {secret} f.tmp && mv -fT f.tmp f; echo inside > g.tmp && mv -fT g.tmp f; "
        f"ln -sfn {created} h.tmp && mv -fT h.tmp g; echo inside > h.tmp && mv -fT h.tmp g; "
        f"done # {marker}"
    )

    async def body(rt: Runtime) -> None:
        await rt.write("f", "inside")
        await rt.write("g", "inside")
        await rt.run(f"sh -c '{swap}' > /dev/null 2>&1 &")
        deadline = time.monotonic() + 10
        calls = 0
        while calls < 400 and time.monotonic() < deadline:
            calls += 1
            try:
                data = await rt.read("f")
            except OSError:
                data = b""
            assert f"host secret {marker}".encode() not in data
            with contextlib.suppress(OSError):
                await rt.write("g", f"from host {calls}")
            assert not exists(created), f"a host file was created after {calls} calls"
        assert calls >= 100

    in_runtime("bwrap", body, **bwrap_root)
    assert not created.exists()
    assert secret.read_text() == f"host secret {marker}"


def test_six_200mb_processes_do_not_all_survive_a_256mb_sandbox(
    marker: str, bwrap_root: dict[str, str]
) -> None:
    hog = "import time; x = b'x' * (200 << 20); time.sleep(4); print('survived')"

    async def body(rt: Runtime) -> None:
        assert isinstance(rt, BwrapRuntime)
        if not rt.bounds["memory"]:
            pytest.skip("no memory cgroup can be made here: the total is not bounded")
        script = f'for i in 1 2 3 4 5 6; do python3 -c "{hog}" & done; wait # {marker}'
        result = await rt.run(script, timeout=60)
        assert result.stdout.count("survived") < 6

    in_runtime("bwrap", body, memory_mb=256, **bwrap_root)


def test_tmp_and_dev_are_bounded_by_default(marker: str, bwrap_root: dict[str, str]) -> None:
    async def body(rt: Runtime) -> None:
        fill = "for i in $(seq 20); do head -c 50M /dev/zero > /tmp/f$i || echo FULL$i; done"
        result = await rt.run(f"{fill}; du -sm /tmp # {marker}", timeout=120)
        assert "FULL" in result.stdout, "20 x 50 MB all fit into /tmp"
        used_mb = int(result.stdout.split()[-2])
        assert used_mb <= 520
        shm = await rt.run("head -c 100M /dev/zero > /dev/shm/x || echo FULL")
        assert "FULL" in shm.stdout
        dev = await rt.run("touch /dev/new && echo made")
        assert "made" not in dev.stdout

    in_runtime("bwrap", body, **bwrap_root)


def test_a_cancelled_stop_still_tears_everything_down(
    marker: str, bwrap_root: dict[str, str]
) -> None:
    async def main() -> None:
        rt = create_runtime(runtime_config("bwrap", **bwrap_root))
        assert isinstance(rt, BwrapRuntime)
        await rt.start()
        await rt.run(f"sleep {marker} &")
        workdir, pid = rt.workdir, rt.sandbox_pid
        cgroups = list(rt._cgroup.paths) if rt._cgroup is not None else []
        task = asyncio.ensure_future(rt.stop())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert workdir is not None and not workdir.exists()
        assert pid is not None and not alive(pid)
        assert not any(p.exists() for p in cgroups)
        assert not processes_with(marker)
        await rt.stop()  # idempotent

    asyncio.run(main())


KILLED_CHILD = """
import asyncio, os, signal, sys
from metrale.runtime import create_runtime, runtime_config
async def one(i):
    rt = create_runtime(runtime_config('bwrap', **{options}))
    await rt.start()
    await rt.run('sleep {marker} > /dev/null 2>&1 &')
    await asyncio.sleep(60)
async def main(delay):
    asyncio.get_running_loop().call_later(delay, os.kill, os.getpid(), signal.SIGKILL)
    for error in await asyncio.gather(*(one(i) for i in range(4)), return_exceptions=True):
        print(repr(error), file=sys.stderr, flush=True)
    await asyncio.sleep(60)
asyncio.run(main(float(sys.argv[1])))
"""


def test_a_sigkilled_metrale_leaves_no_sandbox_process(
    marker: str, bwrap_root: dict[str, str]
) -> None:
    script = KILLED_CHILD.format(marker=marker, options=repr(bwrap_root))
    for attempt in range(10):
        # every sandbox's workdir, so its bwrap's command line, names this dir; o+x, so that
        # the sandboxes' own uid can reach their workdirs in it
        tmp = Path(tempfile.mkdtemp(prefix=f"metrale-test-kill{attempt}-"))
        tmp.chmod(0o711)
        delay = 0.02 + 0.08 * attempt  # from mid-start to well after the starts
        env = {**os.environ, "TMPDIR": str(tmp)}
        proc = subprocess.run(
            [sys.executable, "-c", script, str(delay)], env=env, timeout=120, check=False,
            capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == -9, proc.stderr
        deadline = time.monotonic() + 10
        while processes_with(str(tmp)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = processes_with(str(tmp))
        assert not left, f"try {attempt} (SIGKILL at {delay:.2f} s) left {left}"
        names = {p.name for p in tmp.glob(f"{WORKDIR_PREFIX}*")}
        for cgroup in leftover_cgroups():  # what only `metrale cleanup` could remove
            if cgroup.name in names:
                for _ in range(100):
                    try:
                        cgroup.rmdir()
                        break
                    except OSError:
                        time.sleep(0.05)
        shutil.rmtree(tmp, ignore_errors=True)
