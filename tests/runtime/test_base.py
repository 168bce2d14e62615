"""What every runtime shares is written once, in `runtime.base.RuntimeBase`."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from metrale.runtime.base import RuntimeBase

RUNTIMES = {
    "subprocess": "SubprocessRuntime",
    "bwrap": "BwrapRuntime",
    "docker": "DockerRuntime",
    "ray": "RayRuntime",
}


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_a_runtime_takes_its_commands_through_the_one_run(name: str) -> None:
    """`run(command)` (a string is `sh -c`, a sequence the argv) is RuntimeBase's; a runtime
    writes only `execute(argv)`, so the four cannot drift apart in how they read a command."""
    if name == "ray":
        pytest.importorskip("ray")
    cls = getattr(importlib.import_module(f"metrale.runtime.{name}"), RUNTIMES[name])
    assert issubclass(cls, RuntimeBase)
    own = [k for k in cls.__mro__ if k is not RuntimeBase and issubclass(k, RuntimeBase)]
    for k in own:  # the runtime's class and its own bases (bwrap's commands are a base)
        assert "run" not in vars(k), f"{k.__name__} handles run()'s arguments itself"
    assert any("execute" in vars(k) for k in own)


def test_run_turns_a_string_into_sh_c_and_passes_a_sequence_as_is() -> None:
    seen: list[list[str]] = []

    class Recording(RuntimeBase):
        async def execute(self, argv, *, env, cwd, timeout):  # type: ignore[no-untyped-def]
            seen.append(argv)
            return None

    async def go() -> None:
        rt = Recording(config=None)  # type: ignore[arg-type]
        await rt.run("echo $HOME")
        await rt.run(("ls", "-l"))

    asyncio.run(go())
    assert seen == [["sh", "-c", "echo $HOME"], ["ls", "-l"]]
