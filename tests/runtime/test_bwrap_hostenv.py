"""Nothing of an image's or a task's environment reaches the processes bwrap runs on the host:
the `sh`, `prlimit`, `nsenter` (and the rest) before the sandbox boundary run as root there,
so a `PATH` naming a task's directory or an `LD_*`/`PYTHON*` variable would act as host root.
The command still sees its environment inside."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest

from metrale.runtime import create_runtime, runtime_config
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")

#: Host tools a hostile PATH could shadow: each fake leaves a marker, then runs the real one.
SHADOWED = ("sh", "bash", "prlimit", "nsenter", "env", "setpriv", "unshare", "mount", "bwrap",
            "cat", "dash")  # fmt: skip

PRELOAD_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open("MARKER", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "preload\n", 8); close(fd); }
}
"""


def _task_dir(base: Path) -> tuple[Path, Path]:
    """A task's directory holding fake tools, a preload library and a sitecustomize, each of
    which appends to `ran` when it runs; and where `ran` is."""
    task = base / "task" / "solution"
    task.mkdir(parents=True)
    ran = base / "ran"
    for name in SHADOWED:
        fake = task / name
        fake.write_text(f'#!/bin/sh\necho {name} >> {ran}\nexec /usr/bin/{name} "$@"\n')
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    source = base / "preload.c"
    source.write_text(PRELOAD_C.replace("MARKER", str(ran)))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(task / "evil.so"), str(source)], check=True)
    (task / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'a').write('python\\n')\n")
    return task, ran


def _hostile_env(task: Path, base: Path) -> dict[str, str]:
    relative = os.path.relpath(task, base)  # `ENV PATH=tasks/x/solution:...` is relative
    return {
        "PATH": f"{relative}:{task}:/usr/local/bin:/usr/bin:/bin",
        "LD_PRELOAD": str(task / "evil.so"),
        "LD_LIBRARY_PATH": str(task),
        "LD_DEBUG": "statistics",
        "LD_DEBUG_OUTPUT": str(base / "lddebug"),
        "PYTHONPATH": str(task),
        "PYTHONSTARTUP": str(task / "sitecustomize.py"),
        "PYTHONHOME": str(task),
    }


def test_an_images_environment_acts_only_inside_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bwrap_root: dict[str, str]
) -> None:
    if not Path("/usr/bin/cc").exists():
        pytest.skip("no C compiler for the preload library")
    task, ran = _task_dir(tmp_path)
    env = _hostile_env(task, tmp_path)
    monkeypatch.chdir(tmp_path)  # where a relative PATH entry would resolve on the host
    cfg = runtime_config("bwrap", env=env, **bwrap_root)

    async def main() -> tuple[str, str, str]:
        async with create_runtime(cfg) as rt:
            seen = await rt.run('printf "%s|%s" "$LD_DEBUG_OUTPUT" "$PYTHONPATH"')
            called = await rt.run(["sh", "-c", "echo $LD_DEBUG"], env={"LD_PRELOAD": "x.so"})
            await rt.write("f.txt", b"data")  # a transfer, through the host or inside
            back = (await rt.read("f.txt")).decode()
            return seen.stdout, called.stdout.strip(), back

    seen, called, back = asyncio.run(main())
    # inside, the command has its environment (the loader's statistics may come first: the
    # sandbox has no such LD_DEBUG_OUTPUT directory)
    assert seen.endswith(f"{tmp_path / 'lddebug'}|{task}")
    assert called.endswith("statistics") and back == "data"
    # outside, nothing ran from the task's directory and nothing was written by a loader
    assert not ran.exists(), f"host-side processes ran the task's code: {ran.read_text()}"
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("lddebug"))
    assert leftovers == [], f"a host process wrote LD_DEBUG_OUTPUT files: {leftovers}"
