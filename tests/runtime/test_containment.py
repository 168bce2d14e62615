"""Containment that both host runtimes promise: timeouts kill, stop() leaves nothing, output
is capped, the host's secrets stay outside. Each test also checks (via the `marker` fixture)
that no process of it is left on the host."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from metrale.runtime import Runtime, create_runtime, runtime_config
from tests.runtime.conftest import HAVE_BWRAP, processes_with

RUNTIMES = [
    "subprocess",
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")),
]


def in_runtime(name: str, body: Callable[[Runtime], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        async with create_runtime(runtime_config(name, **options)) as rt:
            return await body(rt)

    return asyncio.run(main())


@pytest.mark.parametrize("name", RUNTIMES)
def test_never_ending_command_is_killed_at_its_timeout(name: str, marker: str) -> None:
    async def body(rt: Runtime) -> None:
        started = time.perf_counter()
        result = await rt.run(f"sleep {marker}; echo never", timeout=0.5)
        assert result.timed_out and result.exit_code == 124
        assert "never" not in result.stdout
        assert time.perf_counter() - started < 5
        assert not processes_with(marker), "the timed-out command survived its timeout"

    in_runtime(name, body)


@pytest.mark.parametrize("name", RUNTIMES)
def test_background_servers_are_gone_after_stop(name: str, marker: str) -> None:
    async def body(rt: Runtime) -> None:
        # a plain background job, one that left the session, and a double-forked daemon
        result = await rt.run(
            f"sleep {marker} & setsid sleep {marker} > /dev/null 2>&1 & "
            f"(setsid sh -c 'sleep {marker}' &) ; echo started"
        )
        assert result.stdout.strip() == "started"
        assert result.duration_s < 5, "run() waited for background children"
        await asyncio.sleep(0.2)
        assert len(processes_with(marker)) >= 3
        await rt.stop()
        assert not processes_with(marker)
        await rt.stop()  # idempotent

    in_runtime(name, body)


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_1gb_output_is_capped_head_and_tail(name: str, marker: str) -> None:
    cap = 64 * 1024

    async def body(rt: Runtime) -> None:
        result = await rt.run(
            f"echo HEAD-{marker}; head -c 1G /dev/zero; echo; echo TAIL-{marker}", timeout=120
        )
        assert result.exit_code == 0
        assert result.stdout.startswith(f"HEAD-{marker}")
        assert result.stdout.rstrip().endswith(f"TAIL-{marker}")
        assert len(result.stdout.encode()) < cap + 100
        total = len(f"HEAD-{marker}\n") + (1 << 30) + 1 + len(f"TAIL-{marker}\n")
        assert result.stdout_dropped == total - cap

    in_runtime(name, body, output_cap_bytes=cap)


@pytest.mark.parametrize("name", RUNTIMES)
def test_host_secrets_are_not_visible(name: str, marker: str, monkeypatch: Any) -> None:
    for key in ("METRALE_TEST_API_KEY", "METRALE_TEST_TOKEN", "METRALE_DB_PASSWORD",
                "METRALE_TEST_SECRET"):  # fmt: skip
        monkeypatch.setenv(key, f"secret-{marker}")

    async def body(rt: Runtime) -> None:
        result = await rt.run("env; cat /proc/self/environ")
        assert result.exit_code == 0
        assert f"secret-{marker}" not in result.stdout
        given = await rt.run("echo $MINE", env={"MINE": "explicit"})
        assert given.stdout.strip() == "explicit"

    in_runtime(name, body)


@pytest.mark.parametrize("name", RUNTIMES)
def test_files_round_trip_and_commands_run_in_the_workdir(name: str, marker: str) -> None:
    async def body(rt: Runtime) -> None:
        await rt.write("sub/in.txt", f"hello {marker}")
        result = await rt.run("cat in.txt && echo made > out.txt", cwd="sub")
        assert result.stdout == f"hello {marker}"
        assert await rt.read("sub/out.txt") == b"made\n"
        seq = await rt.run(["sh", "-c", 'printf "%s" "$1"', "sh", "a b"])
        assert seq.stdout == "a b"

    in_runtime(name, body)


@pytest.mark.parametrize("name", RUNTIMES)
def test_cpu_limit_applies(name: str, marker: str) -> None:
    async def body(rt: Runtime) -> None:
        result = await rt.run(f"echo {marker} >/dev/null; while :; do :; done", timeout=20)
        assert not result.timed_out and result.exit_code != 0  # SIGXCPU / SIGKILL at 1 s

    in_runtime(name, body, cpu_s=1)
