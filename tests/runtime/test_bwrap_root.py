"""bwrap over an exported image root (`root`, `seed`, `scratch`): the sandbox sees the image's
system and none of the host's, the workdir starts as a writable copy of the seed, scratch dirs
take writes, the image itself does not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.bwrap import check_bwrap
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")


def test_a_sandbox_over_an_image_root_sees_the_image_and_writes_only_where_given(
    image_root: str, tmp_path: Path, marker: str
) -> None:
    seed = tmp_path / "seed"
    (seed / "sub").mkdir(parents=True)
    (seed / "sub" / "f.txt").write_text(f"seeded {marker}\n")
    host_only = Path("/etc") / f"metrale-host-only-{marker}"
    host_only.write_text("host")
    try:
        cfg = runtime_config(
            "bwrap", root=image_root, seed=str(seed), workdir="/app", scratch=["/logs"]
        )

        async def main() -> dict[str, str]:
            async with create_runtime(cfg) as rt:
                out = {}
                for key, cmd in {
                    "os": "grep -c bookworm /etc/os-release",
                    "host_file": f"test -e {host_only} && echo visible || echo absent",
                    "pwd": "pwd",
                    "seed": "cat sub/f.txt && echo more >> sub/f.txt && echo appended",
                    "scratch": "mkdir -p /logs/v && echo 1 > /logs/v/r && cat /logs/v/r",
                    "image_ro": "touch /usr/x 2>&1 || echo refused",
                }.items():
                    result = await rt.run(cmd)
                    out[key] = result.stdout.strip()
                out["read"] = (await rt.read("/logs/v/r")).decode().strip()
                return out

        out = asyncio.run(main())
    finally:
        host_only.unlink()
    assert int(out["os"]) >= 1
    assert out["host_file"] == "absent"
    assert out["pwd"] == "/app"
    assert out["seed"] == f"seeded {marker}\nappended"
    assert out["scratch"] == "1" and out["read"] == "1"
    assert out["image_ro"].endswith("refused")
    # the seed itself is a copy's source, never written through
    assert (seed / "sub" / "f.txt").read_text() == f"seeded {marker}\n"
    assert not (Path(image_root) / "usr" / "x").exists()


def test_a_root_or_seed_that_is_not_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    for key in ("root", "seed"):
        with pytest.raises(UsageError, match=f"{key} .*is not a directory"):
            check_bwrap(runtime_config("bwrap", **{key: str(tmp_path / "absent")}))


def test_scratch_paths_must_be_absolute() -> None:
    with pytest.raises(UsageError, match="scratch"):
        runtime_config("bwrap", scratch=["logs"])
