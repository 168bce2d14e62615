"""Preparing a bwrap sandbox from an image never follows the image's links on the host: the
WORKDIR is resolved inside the image root, only files, directories and links are copied
(links as links), device nodes and FIFOs are skipped with a reason, and the copy is bounded.
These run the runtime's own preparation (`_prepare`, as `start()` does, as root) over a
crafted exported root; the sandbox itself is not needed to see what the host copied."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from metrale.runtime import runtime_config
from metrale.runtime.base import RuntimeStartError
from metrale.runtime.bwrap import BwrapRuntime
from metrale.runtime.bwrap_setup import sandbox_tmpdir
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")

SECRET = "host secret, mode 0600"


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    """A host directory holding a 0600 file, that an image's links will aim at."""
    secret_dir = tmp_path / "host" / "srv" / "x"
    secret_dir.mkdir(parents=True)
    (secret_dir / "secret.txt").write_text(SECRET)
    (secret_dir / "secret.txt").chmod(0o600)
    return secret_dir


def _prepare(root: Path, workdir: str, **options: object) -> tuple[BwrapRuntime, Path]:
    cfg = runtime_config("bwrap", root=str(root), workdir=workdir, seed_from_root=True,
                         **options)  # fmt: skip
    rt = BwrapRuntime(cfg)
    rt._prepare(sandbox_tmpdir())
    return rt, rt.host_workdir


def _files(top: Path) -> dict[str, str]:
    return {
        str(p.relative_to(top)): ("link" if p.is_symlink() else "dir" if p.is_dir() else "file")
        for p in top.rglob("*")
    }


def test_a_workdir_that_is_a_chain_of_links_out_of_the_image_copies_nothing_of_the_host(
    tmp_path: Path, host_secret: Path
) -> None:
    root = tmp_path / "rootfs"
    (root / "proc").mkdir(parents=True)
    (root / "srv").mkdir()
    # app -> b -> c -> ../../proc/self/root<host dir>: every hop a link, the last out of the
    # image through the host's /proc (old code copied the 0600 file and chowned it to the
    # sandbox's uid); a magic path, an absolute link and `..` straight at the host directory
    os.symlink(f"../../../../../../../../proc/self/root{host_secret}", root / "c")
    os.symlink(f"proc/self/root{host_secret}", root / "magic")
    os.symlink("c", root / "b")
    os.symlink("b", root / "app")
    os.symlink(str(host_secret), root / "abs")
    os.symlink(f"../../../../../../..{host_secret}", root / "dots")
    for workdir in ("/app", "/magic", "/abs", "/dots", f"/../../..{host_secret}"):
        rt, work = _prepare(root, workdir)
        try:
            copied = _files(work)
            assert "secret.txt" not in copied, f"{workdir}: the host's file was copied"
            assert not any(SECRET in p.read_text() for p in work.rglob("*") if p.is_file())
        finally:
            rt._finish()
    assert (host_secret / "secret.txt").stat().st_uid == os.getuid()  # never chowned


def test_a_link_inside_the_image_resolves_inside_it_as_docker_does(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "srv" / "real").mkdir(parents=True)
    (root / "srv" / "real" / "f.txt").write_text("in the image")
    os.symlink("/srv/real", root / "app")  # absolute, meaning the image's /srv/real
    rt, work = _prepare(root, "/app")
    try:
        assert (work / "f.txt").read_text() == "in the image"
    finally:
        rt._finish()


def test_devices_and_fifos_are_skipped_with_a_reason_and_links_copied_as_links(
    tmp_path: Path, host_secret: Path
) -> None:
    root = tmp_path / "rootfs"
    app = root / "app"
    (app / "sub").mkdir(parents=True)
    (app / "sub" / "ok.txt").write_text("ok")
    os.mknod(app / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    os.mkfifo(app / "fifo")
    os.symlink(str(host_secret / "secret.txt"), app / "link")
    rt, work = _prepare(root, "/app")
    try:
        assert (work / "sub" / "ok.txt").read_text() == "ok"
        assert not (work / "zero").exists() and not (work / "fifo").exists()
        assert (work / "link").is_symlink()
        assert os.readlink(work / "link") == str(host_secret / "secret.txt")
        assert (host_secret / "secret.txt").stat().st_uid == os.getuid()  # the link, not it
        assert sorted(rt.seed_skipped) == ["fifo: a FIFO, not copied",
                                           "zero: a character device, not copied"]  # fmt: skip
    finally:
        rt._finish()


def test_a_huge_sparse_file_is_refused_with_the_bound(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "app").mkdir(parents=True)
    with open(root / "app" / "huge", "wb") as f:
        f.truncate(3 << 30)
    rt = BwrapRuntime(runtime_config("bwrap", root=str(root), workdir="/app",
                                     seed_from_root=True, seed_max_mb=64))  # fmt: skip
    try:
        with pytest.raises(RuntimeStartError, match="larger than 64 MB"):
            rt._prepare(sandbox_tmpdir())
    finally:
        rt._finish()


def test_a_workdir_the_image_lacks_is_made_empty_and_one_that_is_a_file_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()
    (root / "file").write_text("x")
    rt, work = _prepare(root, "/never/made")
    try:
        assert work.is_dir() and list(work.iterdir()) == []
    finally:
        rt._finish()
    rt = BwrapRuntime(runtime_config("bwrap", root=str(root), workdir="/file",
                                     seed_from_root=True))  # fmt: skip
    try:
        with pytest.raises(RuntimeStartError, match="WORKDIR /file is not a directory"):
            rt._prepare(sandbox_tmpdir())
    finally:
        rt._finish()


def test_a_users_seed_is_copied_the_same_safe_way(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "a.txt").write_text("a")
    os.mkfifo(seed / "fifo")
    rt = BwrapRuntime(runtime_config("bwrap", seed=str(seed)))
    try:
        rt._prepare(sandbox_tmpdir())
        assert (rt.host_workdir / "a.txt").read_text() == "a"
        assert rt.seed_skipped == ["fifo: a FIFO, not copied"]
    finally:
        rt._finish()
