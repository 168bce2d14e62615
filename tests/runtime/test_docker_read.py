"""The docker runtime's `read()` is bounded: the `cp` tar stream is refused at the member's
header when it is no regular file or larger than the cap, never buffered whole first (a 3 GB
sparse file once peaked metrale at 6.4 GB RSS); `kill_commands` ends a `setsid` daemon and
leaves the container usable."""

from __future__ import annotations

import asyncio
import resource
import time

import pytest

from metrale.runtime import create_runtime, runtime_config
from metrale.runtime.docker import READ_CAP_BYTES
from tests.runtime.engine import require_engine

RSS_GROWTH_MB = 200


@pytest.fixture(autouse=True)
def engine() -> None:
    require_engine()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (f"truncate -s {3 << 30} f", f"larger than {READ_CAP_BYTES} bytes"),
        ("ln -s /dev/zero f", "not a regular file"),
        ("mkfifo f", "not a regular file"),
    ],
)
def test_a_huge_or_special_file_is_refused_at_its_header(make: str, reason: str) -> None:
    before = _rss_mb()

    async def main() -> tuple[str, float]:
        async with create_runtime(runtime_config("docker")) as rt:
            done = await rt.run(make)
            assert done.exit_code == 0, done.stderr
            started = time.monotonic()
            with pytest.raises(FileNotFoundError) as caught:
                await rt.read("f")
            return str(caught.value), time.monotonic() - started

    message, took = asyncio.run(main())
    assert reason in message
    assert took < 60
    assert _rss_mb() - before < RSS_GROWTH_MB


def test_a_regular_file_still_reads_whole() -> None:
    async def main() -> bytes:
        async with create_runtime(runtime_config("docker")) as rt:
            await rt.write("dir/f.bin", bytes(range(256)) * 4096)
            return await rt.read("dir/f.bin")

    assert asyncio.run(main()) == bytes(range(256)) * 4096


def test_kill_commands_ends_a_setsid_daemon_and_the_container_goes_on() -> None:
    # each beat replaces the file whole: a kill between a truncation and its write would
    # otherwise leave it empty
    beat = (
        "setsid sh -c 'while :; do date +%s%N > /tmp/beat.new && mv /tmp/beat.new /tmp/beat; "
        "sleep 0.01; done'"
    )

    async def main() -> tuple[str, str, str]:
        async with create_runtime(runtime_config("docker")) as rt:
            assert (await rt.run(f"{beat} >/dev/null 2>&1 &")).exit_code == 0
            await asyncio.sleep(0.3)
            await rt.kill_commands()
            first = (await rt.run("cat /tmp/beat")).stdout
            await asyncio.sleep(0.3)
            second = (await rt.run("cat /tmp/beat")).stdout
            return first, second, (await rt.run("echo usable")).stdout.strip()

    first, second, usable = asyncio.run(main())
    assert first and first == second, "the daemon still beats after kill_commands"
    assert usable == "usable"
