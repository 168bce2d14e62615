"""Task images against the real engine: base images resolved offline (an absent one is one
line naming it and --base-image), built once and reused by hash, a failed build typed."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.images import (
    ImageBuildError,
    ensure_image,
    export_rootfs,
    parse_base_images,
    remove_rootfs,
)
from metrale.benchmarks.terminal_bench.task import load_task
from metrale.errors import UsageError
from tests.benchmarks.terminal_bench.helpers import DOCKERFILE, write_task
from tests.runtime.engine import require_engine


@pytest.fixture(autouse=True)
def engine() -> None:
    require_engine()


def _rmi(tag: str) -> None:
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False, timeout=120)


def test_an_absent_base_image_names_it_and_the_mapping_option(tmp_path: Path) -> None:
    path = write_task(tmp_path, dockerfile="FROM python:3.12-slim-nowhere\nWORKDIR /app\n")
    task = load_task(str(path))
    with pytest.raises(UsageError) as info:
        asyncio.run(ensure_image(task, "docker", {}, build_timeout_s=60))
    message = str(info.value)
    assert "python:3.12-slim-nowhere" in message and "--base-image NAME=LOCAL" in message
    assert "\n" not in message


def test_a_mapped_base_builds_and_a_second_run_reuses_the_image(tmp_path: Path) -> None:
    dockerfile = DOCKERFILE.replace("debian:bookworm", "python:3.12-nowhere")
    task = load_task(str(write_task(tmp_path, dockerfile=dockerfile)))
    mapping = parse_base_images("python:3.12-nowhere=debian:bookworm")
    first = asyncio.run(ensure_image(task, "docker", mapping, build_timeout_s=120))
    try:
        assert not first.cached and first.build_s > 0
        assert first.tag.startswith("metrale-task/line-sums:")
        assert first.workdir == "/srv/puzzle"
        again = asyncio.run(ensure_image(task, "docker", mapping, build_timeout_s=120))
        assert again.cached and again.build_s == 0.0 and again.tag == first.tag
        # an edited environment is a new image
        (task.environment_dir / "extra.txt").write_text("changed")
        edited = asyncio.run(ensure_image(task, "docker", mapping, build_timeout_s=120))
        assert edited.tag != first.tag and not edited.cached
        _rmi(edited.tag)
    finally:
        _rmi(first.tag)


def test_a_failing_build_is_an_image_build_error_with_its_output(tmp_path: Path) -> None:
    dockerfile = "FROM debian:bookworm\nRUN echo the-build-broke >&2 && exit 3\n"
    task = load_task(str(write_task(tmp_path, dockerfile=dockerfile)))
    with pytest.raises(ImageBuildError) as info:
        asyncio.run(ensure_image(task, "docker", {}, build_timeout_s=120))
    assert info.value.kind == "image_build"
    assert "line-sums" in str(info.value)


def test_the_exported_root_is_the_image_s_and_is_cached(tmp_path: Path) -> None:
    task = load_task(str(write_task(tmp_path)))
    image = asyncio.run(ensure_image(task, "docker", {}, build_timeout_s=120))
    try:
        root = asyncio.run(export_rootfs(image, "docker"))
        assert (root / "srv" / "puzzle" / "numbers.txt").read_text() == "3 4 5\n10 20 30\n"
        assert (root / "usr" / "bin" / "git").exists()
        again = asyncio.run(export_rootfs(image, "docker"))
        assert again == root and image.export_s == 0.0
    finally:
        _rmi(image.tag)
        if image.rootfs is not None:
            remove_rootfs(image.rootfs)


@pytest.mark.parametrize("text", ["python", "=x", "a=", "a=b,c"])
def test_bad_mappings_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="NAME=LOCAL"):
        parse_base_images(text)
