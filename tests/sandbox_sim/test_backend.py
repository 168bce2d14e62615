"""The emulators' real sandboxes (bwrap here; the docker backend is the docker runtime, tested
with it): made, used and deleted by id, and none left after `close()`, even one whose start
was still in flight. Also the command line: SIGTERM deletes every live sandbox."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.runtime.base import RuntimeStartError
from metrale.runtime.bwrap_setup import WORKDIR_PREFIX
from metrale.sandbox_sim.backend import Backend, SandboxGone, parse_image_map
from tests.conftest import run_cli
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")
SRC = Path(__file__).resolve().parents[2] / "src"


def _workdirs() -> set[str]:
    """This process's sandbox workdirs (not the one `/etc` every sandbox of it shares)."""
    found = Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{os.getpid()}-*")
    return {p.name for p in found if "-etc-" not in p.name}


def test_create_exec_files_labels_and_delete() -> None:
    async def main() -> None:
        backend = Backend("bwrap")
        sid = await backend.create("any:tag", env={"FROM_CREATE": "yes"}, labels={"run": "r1"})
        try:
            result = await backend.exec(sid, ["sh", "-c", 'echo "$FROM_CREATE $X"; pwd'],
                                        env={"X": "x"}, cwd="/tmp")  # fmt: skip
            assert result.stdout.split() == ["yes", "x", "/tmp"]
            await backend.write(sid, "/work/a/b.bin", bytes(range(256)))
            assert await backend.read(sid, "/work/a/b.bin") == bytes(range(256))
            timed = await backend.exec(sid, ["sleep", "30"], timeout=0.5)
            assert timed.timed_out
            assert [(s.id, s.image, s.labels) for s in backend.live()] == [
                (sid, "any:tag", {"run": "r1"})
            ]
        finally:
            assert await backend.delete(sid)
        assert not await backend.delete(sid)
        with pytest.raises(SandboxGone):
            await backend.exec(sid, ["true"])
        assert backend.live() == []

    asyncio.run(main())
    assert _workdirs() == set()


def test_close_deletes_every_sandbox_and_one_still_starting() -> None:
    async def main() -> None:
        backend = Backend("bwrap")
        ids = await asyncio.gather(*(backend.create("img") for _ in range(3)))
        assert len(backend.live()) == 3
        late = asyncio.ensure_future(backend.create("img"))
        await asyncio.sleep(0)  # its start is under way
        await backend.close()
        with pytest.raises((RuntimeStartError, asyncio.CancelledError)):  # never live
            await late
        assert backend.live() == [] and ids

    asyncio.run(main())
    assert _workdirs() == set()


def test_bad_image_maps_and_backends_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="NAME=LOCAL"):
        parse_image_map(["python:3.11"])
    with pytest.raises(UsageError, match="exported root"):
        Backend("bwrap", {"python:3.11": str(tmp_path / "absent")})
    with pytest.raises(UsageError, match="accepted: bwrap, docker, auto"):
        Backend("lxc")
    assert Backend("bwrap", parse_image_map([f"py={tmp_path}"])).images == {"py": str(tmp_path)}


def test_sigterm_of_the_command_deletes_its_live_sandboxes() -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale", "sandbox-sim", "prime", "--port", "0"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("metrale sandbox-sim prime listening on http://127.0.0.1:")
        client = dict(line.strip().split("=", 1) for line in lines[1:])
        assert set(client) == {"PRIME_API_BASE_URL", "PRIME_API_KEY"}
        url = client["PRIME_API_BASE_URL"]
        created = _create_two(url, client["PRIME_API_KEY"])
        workdirs = _wait_workdirs(proc.pid, 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0  # a server asked to stop, as `metrale sim`
        assert created == 2 and len(workdirs) == 2
        assert not any(Path(tempfile.gettempdir(), w).exists() for w in workdirs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _create_two(url: str, key: str) -> int:
    import json
    import urllib.request

    made = 0
    for _ in range(2):
        request = urllib.request.Request(
            f"{url}/sandbox", method="POST",
            data=json.dumps({"name": "t", "docker_image": "img"}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            made += response.status == 200
    return made


def _wait_workdirs(pid: int, count: int) -> list[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [
            p.name
            for p in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{pid}-*")
            if "-etc-" not in p.name
        ]
        if len(found) >= count:
            return found
        time.sleep(0.1)
    return []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["modal-x"], "unknown sandbox service 'modal-x'; accepted: prime"),
        (["prime", "--create-latency", "9,3"], "--create-latency '9,3'"),
        (["prime", "--create-latency", "x"], "--create-latency 'x' must be P50,P90"),
        (["prime", "--stuck", "2"], "--stuck"),
        (["prime", "--create-rate", "0"], "--create-rate"),
        (["prime", "--image", "python:3.11"], "must be NAME=LOCAL"),
        (["prime", "--backend", "lxc"], "accepted: bwrap, docker, auto"),
        (["prime", "--port", "99999"], "--port"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args: list[str], named: str) -> None:
    proc = run_cli(["sandbox-sim", *args], timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
