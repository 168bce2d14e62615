"""The image builder against the real engine, as an attacker's Dockerfile: a build step that
reaches the host's tree (CVE-2024-1753's bind from a stage's symlink to `/`, here let through
the Dockerfile refusal on purpose) can neither write as host root nor read root's files, and
the image it builds is an ordinary one (root-owned files, runnable, exported for bwrap)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench import images
from metrale.benchmarks.terminal_bench.builder import BUILD_UID_BASE, find_builder
from metrale.benchmarks.terminal_bench.task import load_task, parse_dockerfile
from metrale.errors import UsageError
from tests.benchmarks.terminal_bench.helpers import write_task
from tests.runtime.engine import require_engine

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the builder's namespace needs root")

#: The link's stage names the sentinel so that it is never a cached layer: the engine's builder
#: mounts a cached stage differently, and only a fresh one reached the host.
ESCAPE = """FROM debian:bookworm AS link
RUN ln -s / /hostroot && : {dir}
FROM debian:bookworm
RUN --mount=type=bind,from=link,source=/hostroot,target=/x,rw \\
    sh -c 'echo written > /x{dir}/written; cat /x{dir}/secret > /leak; \\
           ls -ln /x{dir} > /listing; true'
RUN mkdir -p /app && echo ok > /app/made-by-root
"""


@pytest.fixture
def sentinel() -> Iterator[Path]:
    """A host directory anyone may write, holding a file only host root may read."""
    path = Path(tempfile.mkdtemp(prefix="metrale-test-sentinel-"))
    path.chmod(0o777)
    (path / "secret").write_text("TOPSECRET-host-root-only\n")
    (path / "secret").chmod(0o600)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _cat(tag: str, path: str) -> str:
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", tag, "cat", path],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return proc.stdout


def test_a_build_step_over_the_host_root_is_not_host_root(tmp_path: Path, sentinel: Path) -> None:
    require_engine()
    builder = find_builder()
    assert builder is not None, "scripts/container-engine.sh up sets up the builder's range"
    task = load_task(str(write_task(tmp_path, name="escape-task")))
    evil = parse_dockerfile(ESCAPE.format(dir=sentinel))
    task = dataclasses.replace(task, dockerfile=evil)  # past the refusal, straight to a build
    base_ids = asyncio.run(images.resolve_bases(task, "docker", {}))
    tag = images.image_tag(task, images.context_hash(task, base_ids))
    asyncio.run(images._build_in_namespace(builder, task, "docker", tag, base_ids, 300))
    try:
        written = sentinel / "written"
        assert not written.exists() or written.stat().st_uid >= BUILD_UID_BASE
        assert "TOPSECRET" not in _cat(tag, "/leak")
        assert "65534" in _cat(tag, "/listing")  # host root's files are nobody's in there
        assert _cat(tag, "/app/made-by-root") == "ok\n"
        info = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{index .Config.Labels \"metrale.task\"}}",
             tag], capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert info.stdout.strip() == "escape-task"
        record = asyncio.run(images.inspect("docker", tag))
        assert record is not None
        image_id = str(record["Id"]).removeprefix("sha256:")
        image = images.TaskImage(tag=tag, image_id=image_id, cached=True, build_s=0, workdir=None)
        root = asyncio.run(images.export_rootfs(image, "docker"))
        try:
            made = root / "app" / "made-by-root"
            assert made.read_text() == "ok\n" and made.stat().st_uid == 0
            assert (root / "usr" / "bin" / "git").stat().st_uid == 0
        finally:
            images.remove_rootfs(root)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_the_refused_escape_never_reaches_a_builder(tmp_path: Path, sentinel: Path) -> None:
    """Through the user's path (load, then build): refused before any build, host untouched."""
    require_engine()
    path = write_task(tmp_path, name="escape-task", dockerfile=ESCAPE.format(dir=sentinel))
    try:
        task = load_task(str(path))
        image = asyncio.run(images.ensure_image(task, "docker", {}, build_timeout_s=120))
        subprocess.run(["docker", "rmi", "-f", image.tag], capture_output=True, timeout=120)
    except UsageError as exc:
        assert "escape-task" in str(exc) and "line 4" in str(exc)
    assert sorted(p.name for p in sentinel.iterdir()) == ["secret"]
