"""A rollout's network follows `allow_internet`, in real sandboxes: a socket listens on this
host's non-loopback address (there is no internet here; a network namespace tells the two
apart: it is reachable from the host's network and from a container's bridge, not from a
sandbox with loopback only), and a task's verifier tries to connect to it. The task that allows
the internet reaches it, the one that does not cannot, on docker, on bwrap, and on prime
through the official SDK and `metrale sandbox-sim prime --backend docker` (the emulator keeps
the egress rule the SDK sent: `network_allowlist=[]` for the offline task, none for the online
one). The images this test builds (and bwrap's exported roots) are removed after it. Run under
the engine lock."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.images import remove_rootfs, rootfs_cache
from tests.benchmarks.terminal_bench.helpers import write_task
from tests.benchmarks.terminal_bench.test_benchmark import metrale
from tests.runtime.conftest import HAVE_BWRAP
from tests.runtime.engine import labelled_containers, require_engine
from tests.runtime.prime_emulator import client_env, prime_emulator

pytestmark = pytest.mark.slow

#: test.sh: reward 1 when what the task expects (`EXPECT`: reached or unreached) happened.
PROBE = """#!/bin/bash
mkdir -p /logs/verifier
if timeout 5 bash -c "exec 3<>/dev/tcp/$PROBE_HOST/$PROBE_PORT" 2>/dev/null; then
    seen=reached
else
    seen=unreached
fi
echo "$seen $PROBE_HOST:$PROBE_PORT"
if [ "$seen" = "$EXPECT" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def host_address() -> str | None:
    """This host's address on its default route (not loopback), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # no packet is sent: only the route is looked up
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.fixture
def listener() -> Iterator[tuple[str, int, list[str]]]:
    """A TCP socket on the host's non-loopback address; yields it and who connected."""
    address = host_address()
    if address is None:
        pytest.skip("this host has no non-loopback address")
    server = socket.create_server((address, 0))
    server.settimeout(0.2)
    peers: list[str] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            peers.append(peer[0])
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield address, server.getsockname()[1], peers
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()


def write_probe(data: Path, name: str, *, allowed: bool, host: str, port: int) -> None:
    # a Dockerfile of this test run only: its image is built here and removed after
    dockerfile = f"FROM debian:bookworm\nWORKDIR /probe\n# metrale network test {uuid.uuid4()}\n"
    task = write_task(data, name, test=PROBE, dockerfile=dockerfile)
    toml = task / "task.toml"
    text = toml.read_text().replace(
        "allow_internet = false", f"allow_internet = {str(allowed).lower()}"
    )
    expect = "reached" if allowed else "unreached"
    text += f'\n[verifier.env]\nPROBE_HOST = "{host}"\nPROBE_PORT = {port}\nEXPECT = "{expect}"\n'
    toml.write_text(text)


def remove_images(tags: set[str]) -> None:
    for tag in tags:
        inspect = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
        image_id = inspect.stdout.strip().removeprefix("sha256:")
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
        if image_id:
            remove_rootfs(rootfs_cache() / image_id[:32])


@pytest.mark.parametrize("runtime", ["docker", "bwrap", "prime"])
def test_a_task_reaches_the_host_network_exactly_when_it_allows_the_internet(
    tmp_path: Path, runtime: str, listener: tuple[str, int, list[str]]
) -> None:
    if runtime == "bwrap" and not HAVE_BWRAP:
        pytest.skip("bwrap is not installed")
    require_engine()
    host, port, peers = listener
    data = tmp_path / "data"
    data.mkdir()
    write_probe(data, "offline", allowed=False, host=host, port=port)
    write_probe(data, "online", allowed=True, host=host, port=port)
    out = tmp_path / "run"
    tags: set[str] = set()
    try:
        with contextlib.ExitStack() as remote:
            if runtime == "prime":
                pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")
                emulator = remote.enter_context(prime_emulator("--backend", "docker"))
                remote.enter_context(client_env(emulator))
            pid, done = metrale("run", "terminal_bench", "-p", f"task={data}", "-p", "agent=nop",
                                "--runtime", runtime, "--out", str(out), "--json",
                                timeout=600)  # fmt: skip
            if runtime == "prime":
                assert emulator.left() == [], "the emulator still holds a sandbox"
        assert not labelled_containers(**{"metrale.sandbox.pid": str(pid)}), "a container is left"
        records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
        tags = {r["metrics"]["image"] for r in records if r["metrics"].get("image")}
        by_task = {r["metrics"]["task"]: r for r in records}
        assert sorted(by_task) == ["offline", "online"], done.stderr
        for name, seen in (("offline", "unreached"), ("online", "reached")):
            record = by_task[name]
            assert record["error"] is None, record
            assert record["metrics"]["verifier_output"].startswith(seen), record["metrics"]
            assert record["reward"] == 1.0
        assert peers, "the host's socket saw no connection"
    finally:
        remove_images(tags)
