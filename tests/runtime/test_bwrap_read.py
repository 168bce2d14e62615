"""bwrap's `read()` of a path outside the workdir (through the sandbox, where links resolve to
the sandbox's own files) takes only a regular file, in bounded time: a FIFO or a link to
/dev/zero is refused with the reason, never waited on or read into metrale's memory."""

from __future__ import annotations

import asyncio
import resource
import time

import pytest

from metrale.runtime import create_runtime, runtime_config
from tests.runtime.conftest import HAVE_BWRAP

pytestmark = pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap (bubblewrap) is not installed")


@pytest.mark.parametrize("make", ["mkfifo /tmp/f", "ln -s /dev/zero /tmp/f", "mkdir /tmp/f"])
def test_a_special_file_outside_the_workdir_is_refused_quickly(make: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def main() -> tuple[str, float]:
        async with create_runtime(runtime_config("bwrap")) as rt:
            assert (await rt.run(make)).exit_code == 0
            started = time.monotonic()
            with pytest.raises(OSError) as caught:
                await asyncio.wait_for(rt.read("/tmp/f"), 60)
            return str(caught.value), time.monotonic() - started

    message, took = asyncio.run(main())
    assert "not a regular file" in message and took < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10  # KiB


def test_a_regular_file_outside_the_workdir_still_reads() -> None:
    async def main() -> bytes:
        async with create_runtime(runtime_config("bwrap")) as rt:
            await rt.run("printf 'in tmp' > /tmp/f && ln -s /tmp/f /tmp/link")
            return await rt.read("/tmp/link")

    assert asyncio.run(main()) == b"in tmp"


def test_a_binary_file_outside_the_workdir_reads_byte_for_byte() -> None:
    """Through the sandbox, a file's bytes come back as they are: a command's stdout is text
    (invalid UTF-8 replaced), a file is not. Written through the sandbox too."""
    blob = bytes(range(256)) * 64 + b"\xff\xfe\x00\x80"

    async def main() -> tuple[bytes, str]:
        async with create_runtime(runtime_config("bwrap")) as rt:
            await rt.write("/tmp/blob.bin", blob)
            size = (await rt.run("wc -c < /tmp/blob.bin")).stdout.strip()
            return await rt.read("/tmp/blob.bin"), size

    read, size = asyncio.run(main())
    assert size == str(len(blob)) and read == blob
