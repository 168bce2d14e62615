"""`tests/runtime/engine.py` asks for the container engine only when a test needs it: importing
it (which collecting the suite does) must run neither `docker` nor the engine's script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake_docker(bin_dir: Path, calls: Path) -> None:
    """A `docker` on PATH and an engine script beside it that only note each call and say no
    engine answers (the real ones would touch the shared engine)."""
    bin_dir.mkdir()
    for name, says in (("docker", "docker"), ("engine.sh", "script")):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{says} $@" >> {calls}\necho "no engine" >&2\nexit 1\n')
        tool.chmod(0o755)


def _python(code: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}",
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        "CI": "",
    }
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_importing_the_engine_helper_runs_nothing(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    _fake_docker(tmp_path / "bin", calls)
    proc = _python("import tests.runtime.engine", tmp_path / "bin")
    assert proc.returncode == 0, proc.stderr
    assert not calls.exists(), f"docker ran at import: {calls.read_text()}"


def test_a_test_that_needs_the_engine_asks_once(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    _fake_docker(tmp_path / "bin", calls)
    code = (
        "import pytest\n"
        "from pathlib import Path\n"
        "from tests.runtime import engine\n"
        f"engine.SCRIPT = Path({str(tmp_path / 'bin' / 'engine.sh')!r})\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        engine.require_engine()\n"
        "    except pytest.skip.Exception as exc:\n"
        "        print('skipped:', exc)\n"
    )
    proc = _python(code, tmp_path / "bin")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("skipped: no container engine") == 3
    # asked once: `docker image inspect`, then the script's `status`, never again
    assert [line.split()[:3] for line in calls.read_text().splitlines()] == [
        ["docker", "image", "inspect"],
        ["script", "status"],
    ]


def test_an_engine_that_stops_answering_fails_each_test_at_once(tmp_path: Path) -> None:
    """A wedged podman answers image commands and hangs on container ones: the first test
    that finds it so waits `PS_TIMEOUT_S` once, the next ones fail without asking again."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = ps ] && exec sleep 30\nexit 0\n')
    docker.chmod(0o755)
    code = (
        "import pytest\n"
        "from tests.runtime import engine\n"
        "engine.PS_TIMEOUT_S = 1\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        engine.require_engine()\n"
        "    except pytest.fail.Exception as exc:\n"
        "        print('failed:', exc)\n"
    )
    proc = _python(code, bin_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("failed: the container engine stopped answering") == 3, proc.stdout
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["image", "ps"]
