"""The sandbox's /etc: one read-only copy per process of the few host files a program needs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from metrale.runtime import Runtime, bwrap_setup
from metrale.runtime.bwrap_etc import ETC_FILES, _fill
from metrale.runtime.bwrap_setup import CONTROL_ROOT
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.test_bwrap import in_bwrap


def _host_etc(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (etc / "passwd").chmod(0o644)
    (etc / "hosts").write_text("secret host\n")
    (etc / "hosts").chmod(0o600)  # not world-readable: stays behind
    (etc / "group").write_text("root:x:0:\n")
    (etc / "group").chmod(0o4755)  # setuid: the copy has no such bit
    elsewhere = tmp_path / "run" / "resolv.conf"
    elsewhere.parent.mkdir()
    elsewhere.write_text("nameserver 10.0.0.1\n")
    (etc / "resolv.conf").symlink_to(elsewhere)  # a top-level link: its content is copied
    ssl = etc / "ssl"
    (ssl / "private").mkdir(parents=True)
    (ssl / "private").chmod(0o700)
    (ssl / "private" / "key.pem").write_text("KEY")
    (ssl / "openssl.cnf").write_text("[ca]\n")
    (ssl / "certs").symlink_to("/usr/share/ca-certificates")  # a link inside: kept as a link
    (etc / "shadow").write_text("root:$6$...\n")  # not in ETC_FILES
    (etc / "shadow").chmod(0o644)
    return etc


def test_the_copy_holds_only_what_everyone_may_read_of_the_listed_files(tmp_path: Path) -> None:
    view = tmp_path / "view"
    view.mkdir()
    _fill(_host_etc(tmp_path), view)
    found = sorted(str(p.relative_to(view)) for p in view.rglob("*"))
    assert found == ["group", "passwd", "resolv.conf", "ssl", "ssl/certs", "ssl/openssl.cnf"]
    assert (view / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"
    assert not (view / "resolv.conf").is_symlink()
    assert os.readlink(view / "ssl" / "certs") == "/usr/share/ca-certificates"
    assert stat.S_IMODE((view / "group").stat().st_mode) == 0o444
    assert stat.S_IMODE((view / "passwd").stat().st_mode) == 0o444


@pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap is not installed")
def test_the_sandbox_sees_the_hosts_listed_files_through_one_read_only_mount() -> None:
    async def body(rt: Runtime) -> dict[str, str]:
        out = {}
        for key, command in {
            "ls": "ls -A /etc",
            "passwd": "cat /etc/passwd",
            "mounts": "awk '$5 ~ /^\\/etc(\\/|$)/ {print $5, $6}' /proc/self/mountinfo",
            "write": "echo x > /etc/passwd 2>&1 || echo refused",
        }.items():
            result = await rt.run(command)
            out[key] = result.stdout
        return out

    seen = in_bwrap(body)
    readable = sorted(
        name
        for name in ETC_FILES
        if os.path.exists(f"/etc/{name}") and os.stat(f"/etc/{name}").st_mode & stat.S_IROTH
    )
    assert seen["ls"].split() == readable
    assert seen["passwd"] == Path("/etc/passwd").read_text()
    mounts = seen["mounts"].splitlines()
    assert len(mounts) == 1 and mounts[0].startswith("/etc ro"), mounts
    assert seen["write"].strip().endswith("refused")


@pytest.mark.parametrize("control_root", [CONTROL_ROOT, "/nonexistent-metrale-control"])
def test_the_copy_goes_on_the_tmpfs_where_the_host_has_one(
    control_root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """~700 entries made and deleted a run cost ~40 times the CPU on a disk's filesystem as on
    a tmpfs, and slowed the next run's workdirs: `/dev/shm` where usable, else the temp dir."""
    monkeypatch.setattr(bwrap_setup, "CONTROL_ROOT", control_root)
    expected = control_root if Path(control_root).is_dir() else str(tmp_path)
    assert bwrap_setup.etc_root(str(tmp_path)) == expected
