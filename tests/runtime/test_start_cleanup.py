"""A runtime whose start fails cleans up after itself, at every step of the start, without its
caller's help: no directory, no cgroup and no process of it is left, and `stop()` is never
called (a cancelled start is often never stopped; the runtime's own promise, in `base`).

Each step of the start is made to fail in turn (a real failure where one can be had: a bind
source that does not exist, a bwrap that refuses its options; otherwise the step's own call
raising, as the kernel or the engine would) and the start is also cancelled at each await.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metrale.runtime import bwrap_layout, create_runtime, runtime_config
from metrale.runtime import bwrap_runtime as bwrap_module
from metrale.runtime.base import RuntimeStartError
from metrale.runtime.cgroups import SandboxCgroup
from tests.runtime.conftest import HAVE_BWRAP

needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")


class Made:
    """What a start made on the host: its workdir, its cgroup directories, its bwrap pid."""

    def __init__(self) -> None:
        self.workdirs: list[Path] = []
        self.cgroups: list[Path] = []
        self.pids: list[int] = []

    def left(self) -> list[str]:
        out = [f"dir {p}" for p in (*self.workdirs, *self.cgroups) if p.exists()]
        out += [f"pid {pid}" for pid in self.pids if _alive(pid)]
        return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[Made]:
    """Spies (the real calls, recorded) on what a bwrap start makes."""
    found = Made()
    real_create = SandboxCgroup.create.__func__  # type: ignore[attr-defined]

    def create(cls: type[SandboxCgroup], *args: Any, **kw: Any) -> SandboxCgroup | None:
        cgroup = real_create(cls, *args, **kw)
        if cgroup is not None:
            found.cgroups += cgroup.paths
        return cgroup

    real_prepare = bwrap_module.BwrapRuntime._prepare

    def prepare(self: bwrap_module.BwrapRuntime, tmp: str) -> Any:
        try:
            return real_prepare(self, tmp)
        finally:
            if self.workdir is not None:
                found.workdirs.append(self.workdir)

    real_spawned = bwrap_module.spawned

    async def spawned(make: Any, pgid: Callable[[Any], int], on_cancel: Any) -> Any:
        proc = await real_spawned(make, pgid, on_cancel)
        found.pids.append(proc.pid)
        return proc

    monkeypatch.setattr(SandboxCgroup, "create", classmethod(create))
    monkeypatch.setattr(bwrap_module.BwrapRuntime, "_prepare", prepare)
    monkeypatch.setattr(bwrap_module, "spawned", spawned)
    yield found


def _bwrap(**options: Any) -> bwrap_module.BwrapRuntime:
    # memory and process bounds: a cgroup is made wherever the host allows one
    runtime = create_runtime(runtime_config("bwrap", memory_mb=256, max_procs=64, **options))
    assert isinstance(runtime, bwrap_module.BwrapRuntime)
    return runtime


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _fail_start(runtime: bwrap_module.BwrapRuntime) -> BaseException:
    async def main() -> BaseException:
        try:
            await runtime.start()
        except BaseException as exc:
            return exc
        raise AssertionError("the start did not fail")

    return asyncio.run(main())


def _raise(exc: BaseException) -> Callable[..., Any]:
    def fail(*_args: Any, **_kw: Any) -> Any:
        raise exc

    return fail


# Each case: how to make one step of the start fail, and what start raises then.
STEPS: dict[str, Callable[[pytest.MonkeyPatch, Path], dict[str, Any]]] = {}


def step(name: str) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    def register(f: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        STEPS[name] = f
        return f

    return register


@step("a bind source that does not exist (prepare)")
def _missing_bind(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    return {"binds": [{"src": str(tmp / "no-such-dir"), "dst": "/data"}]}


@step("the /etc view cannot be made (prepare, after the workdir)")
def _etc(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    monkeypatch.setattr(bwrap_layout, "etc_view", _raise(OSError(28, "No space left on device")))
    return {}


@step("the sandbox cannot be spawned")
def _spawn(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    monkeypatch.setattr(bwrap_module, "spawn", _raise(OSError(11, "Resource busy")))
    monkeypatch.setattr(bwrap_module, "spawn_as", _raise(OSError(11, "Resource busy")))
    return {}


REFUSED = "bwrap refuses to start (its root does not exist)"


@step(REFUSED)
def _bwrap_refuses(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    missing = tmp / "no-such-root"
    missing.mkdir()  # the config checks that it exists; bwrap then finds it gone
    monkeypatch.setattr(bwrap_module.BwrapRuntime, "_fill", _gone_root(missing))
    return {"root": str(missing)}


def _gone_root(root: Path) -> Callable[..., Any]:
    real_fill = bwrap_module.BwrapRuntime._fill

    def fill(self: bwrap_module.BwrapRuntime, tmp: str) -> Any:
        out = real_fill(self, tmp)
        root.rmdir()
        return out

    return fill


@step("the started sandbox cannot be moved into its cgroups")
def _cgroup_refuses(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    monkeypatch.setattr(SandboxCgroup, "enter", _raise(OSError(28, "cannot move pid")))
    return {}


@step("the started sandbox cannot be entered")
def _enter(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    monkeypatch.setattr(bwrap_module, "SandboxProcess", _raise(OSError(3, "No such process")))
    return {}


@needs_bwrap
@pytest.mark.real
@pytest.mark.parametrize("case", list(STEPS))
def test_a_failed_bwrap_start_leaves_nothing_without_a_stop(
    case: str, made: Made, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = STEPS[case](monkeypatch, tmp_path)
    runtime = _bwrap(**options)
    # what every start of the process shares (the watchdog and its stdin pipe, the /etc copy)
    # is made at the runtime check, as a run does, not by the start measured here
    bwrap_module.check_bwrap()
    fds = _open_fds()
    exc = _fail_start(runtime)
    assert isinstance(exc, RuntimeStartError | OSError), repr(exc)
    assert made.workdirs, "the start failed before it made its workdir: the case tests nothing"
    assert made.left() == [], f"{case}: left behind {made.left()}"
    assert runtime.workdir is None or not runtime.workdir.exists()
    left = {f: os.readlink(f"/proc/self/fd/{f}") for f in _open_fds() - fds}
    assert not left, f"the failed start left file descriptors open: {left}"


@needs_bwrap
@pytest.mark.real
@pytest.mark.parametrize("after", ["prepare", "cgroup", "spawn"])
def test_a_bwrap_start_cancelled_at_each_step_leaves_nothing_without_a_stop(
    after: str, made: Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start is cancelled as soon as it has made what `after` names (a start that had
    finished would be its caller's to stop: the readiness wait is the last step cancelled)."""
    reached = asyncio.Event()
    cancelled = threading.Event()
    where: dict[str, asyncio.AbstractEventLoop] = {}
    if after == "prepare":
        real = bwrap_module.BwrapRuntime._fill

        def fill(self: bwrap_module.BwrapRuntime, tmp: str) -> Any:
            out = real(self, tmp)
            where["loop"].call_soon_threadsafe(reached.set)
            return out

        monkeypatch.setattr(bwrap_module.BwrapRuntime, "_fill", fill)
    elif after == "cgroup":  # moved into it once ready, before its first command
        real_enter = SandboxCgroup.enter

        def enter(self: SandboxCgroup, *pids: int) -> None:
            real_enter(self, *pids)
            where["loop"].call_soon_threadsafe(reached.set)
            cancelled.wait(10)  # the last step of a start: cancelled before it returns

        monkeypatch.setattr(SandboxCgroup, "enter", enter)
    else:  # bwrap runs; the start waits for its readiness line
        spy = bwrap_module.spawned

        async def spawned(*args: Any) -> Any:
            proc = await spy(*args)
            reached.set()
            await asyncio.sleep(0)
            return proc

        monkeypatch.setattr(bwrap_module, "spawned", spawned)
    runtime = _bwrap()

    async def main() -> None:
        where["loop"] = asyncio.get_running_loop()
        task = asyncio.ensure_future(runtime.start())
        await asyncio.wait([task, asyncio.ensure_future(reached.wait())],
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        task.cancel()
        cancelled.set()
        with contextlib.suppress(asyncio.CancelledError, RuntimeStartError):
            await task

    asyncio.run(main())
    assert made.workdirs or after == "prepare", "the start never made its workdir"
    assert made.left() == [], f"cancelled after {after}: left behind {made.left()}"


def test_a_failed_subprocess_start_leaves_no_workdir(monkeypatch: pytest.MonkeyPatch) -> None:
    """The subprocess runtime makes one thing, its workdir; a start that cannot make it
    fails with the reason and leaves nothing, and a start after a stop makes nothing."""
    before = set(Path(tempfile.gettempdir()).glob("metrale-sbx-*"))
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-metrale-tmp")
    runtime = create_runtime(runtime_config("subprocess"))
    with pytest.raises(RuntimeStartError, match="cannot create a workdir"):
        asyncio.run(runtime.start())
    monkeypatch.undo()
    stopped = create_runtime(runtime_config("subprocess"))
    asyncio.run(stopped.stop())
    with pytest.raises(RuntimeStartError, match="already stopped"):
        asyncio.run(stopped.start())
    assert set(Path(tempfile.gettempdir()).glob("metrale-sbx-*")) == before
