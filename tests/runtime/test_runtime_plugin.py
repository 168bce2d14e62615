"""A runtime from another package: installed by pip, it is one entry-point line away from
`--runtime toy`, its flags, `metrale exec`, and metrale's conformance suite.

The toy (tests/fixtures/toy_runtime) is built and installed by pip into a directory of its
own, then put on PYTHONPATH: an installed distribution as importlib.metadata sees one, without
touching this environment. A broken plugin is one line at the point it is asked for, and
takes nothing else down.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "fixtures" / "toy_runtime"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build") / "toy_runtime"
    shutil.copytree(TOY, build)  # pip builds in the source tree: keep ours clean
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(where), str(build)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    yield where


def env_with(*paths: Path) -> dict[str, str]:
    path = [*map(str, paths), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def metrale(env: dict[str, str], *args: str, cwd: Path | None = None):  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, "-m", "metrale", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)  # fmt: skip


def test_the_installed_toy_runs_a_command(site: Path, tmp_path: Path) -> None:
    done = metrale(env_with(site), "exec", "--runtime", "toy", "--", "echo", "hi", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    assert not list(Path("/tmp").glob("toy-*")), "the toy's sandbox directory outlived it"


def test_its_flags_are_generated_from_its_config(site: Path, tmp_path: Path) -> None:
    env = env_with(site)
    help_text = metrale(env, "exec", "--help").stdout
    assert "--toy-prefix TEXT" in help_text and "toy:" in help_text
    done = metrale(env, "exec", "--runtime", "toy", "--toy-prefix", "mytoy-", "--",
                   "sh", "-c", "pwd", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name.startswith("mytoy-")
    wrong = metrale(env, "exec", "--runtime", "subprocess", "--toy-prefix", "x", "--", "true")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        "metrale: error: --toy-prefix shapes the toy runtime, and this run's is subprocess; "
        "accepted: --runtime toy"
    ]


def test_a_benchmark_asks_for_capabilities_not_names(site: Path, tmp_path: Path) -> None:
    """terminal_bench needs a task image; the toy declares none: refused in one line that names
    what it lacks and what is installed that has it."""
    done = metrale(env_with(site), "run", "terminal_bench", "--runtime", "toy",
                   "-p", "agent=nop", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()
    assert len(line) == 1 and "toy" in line[0] and "task_image" in line[0], done.stderr
    assert "accepted: bwrap, docker" in line[0]


def test_the_conformance_suite_passes_against_it(site: Path) -> None:
    env = {**env_with(site, ROOT), "METRALE_CONFORMANCE_RUNTIMES": "toy"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "tests/runtime/test_conformance.py", "-k", "toy", "-rs"],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )  # fmt: skip
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail
    passed = int(re.findall(r"(\d+) passed", tail)[-1])
    assert passed >= 8, tail  # the basic promises: files, env, timeout, cap, stop, kill, ...
    assert "toy: runs on the host network" in tail  # what it does not declare is skipped


def test_a_broken_plugin_is_one_line_and_harms_nothing_else(tmp_path: Path) -> None:
    site = tmp_path / "broken"
    info = site / "broken_runtime-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-runtime\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[metrale.runtimes]\nbroken = no_such_module:Cfg\n")
    env = env_with(site)
    asked = metrale(env, "exec", "--runtime", "broken", "--", "true", cwd=tmp_path)
    assert asked.returncode == 2
    assert asked.stderr.strip().splitlines() == [
        "metrale: error: runtime plugin 'broken' (no_such_module:Cfg) cannot be loaded: "
        "ModuleNotFoundError: No module named 'no_such_module'"
    ]
    other = metrale(env, "exec", "--runtime", "subprocess", "--", "echo", "ok", cwd=tmp_path)
    assert (other.returncode, other.stdout) == (0, "ok\n"), other.stderr
    cleaned = metrale(env, "cleanup", "--runtime", "subprocess,broken")
    assert cleaned.returncode == 0, cleaned.stderr
    assert "broken: not checked: runtime plugin 'broken'" in cleaned.stdout
    unknown = metrale(env, "cleanup", "--runtime", "nosuch")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("metrale: error: unknown runtime 'nosuch'; accepted: ")
