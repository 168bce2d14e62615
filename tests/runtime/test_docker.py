"""The docker runtime: argv and usage checks always; the real thing on the engine that
scripts/container-engine.sh brings up (found by tests/runtime/engine.py; fails in CI if absent).
The promises every runtime shares are in test_conformance.py; here is what is docker's own."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.runtime import DockerConfig, check_runtime, create_runtime, runtime_config
from metrale.runtime.docker import LABEL, USERNS_AUTO, DockerRuntime
from tests.runtime.engine import SCRIPT, labelled_containers, require_engine


def test_run_argv_labels_limits_and_isolates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_TEST_API_KEY", "secret-in-argv")
    config = runtime_config("docker", cli="podman", max_procs=9, env={"GIVEN": "1"})
    rt = create_runtime(config)
    assert isinstance(rt, DockerRuntime)
    argv = rt.run_argv()
    assert argv[:3] == ["podman", "run", "-d"]
    assert "metrale/base:bookworm" in argv
    assert f"{LABEL}=1" in argv and f"{LABEL}.pid={os.getpid()}" in argv
    assert argv[argv.index("--network") + 1] == "none"
    assert argv[argv.index("--pids-limit") + 1] == "9"
    assert argv[argv.index("--memory") + 1] == "2048m"
    assert argv[argv.index("--memory-swap") + 1] == "2048m"
    assert argv[argv.index("--pull") + 1] == "never"
    assert "--init" in argv and "--cpus" in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert USERNS_AUTO in argv and "--http-proxy=false" in argv
    assert "GIVEN=1" in argv
    assert not any("secret-in-argv" in a for a in argv)


def test_a_podman_client_creates_with_a_sized_user_namespace_a_docker_cli_with_none() -> None:
    rt = create_runtime(runtime_config("docker"))
    assert isinstance(rt, DockerRuntime)
    plain = rt.run_argv()
    assert plain[:3] == ["docker", "run", "-d"]
    assert not any(a.startswith(("--userns", "--http-proxy")) for a in plain)
    remote = rt.run_argv(("/usr/bin/podman", "--remote", "--url", "unix:///e/podman.sock"))
    assert remote[:5] == ["/usr/bin/podman", "--remote", "--url", "unix:///e/podman.sock", "run"]
    assert USERNS_AUTO in remote and "--http-proxy=false" in remote


def test_a_missing_cli_or_engine_is_one_line_naming_the_script(tmp_path: object) -> None:
    with pytest.raises(UsageError, match="container-engine.sh up"):
        check_runtime(DockerConfig(cli="no-such-docker-cli"))
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/metrale.sock"}
    proc = subprocess.run(
        [sys.executable, "-m", "metrale", "exec", "--runtime", "docker", "--", "true"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no container engine" in lines[0] and "container-engine.sh up" in lines[0]
    assert "/nonexistent/metrale.sock" in lines[0]


def test_a_missing_image_is_a_usage_error_before_any_work() -> None:
    require_engine()
    with pytest.raises(UsageError, match="'no-such/image:1' is not in the engine"):
        check_runtime(DockerConfig(image="no-such/image:1"))


def test_engine_status_prints_the_exports() -> None:
    require_engine()
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    assert status.returncode == 0, status.stdout
    assert "export DOCKER_HOST=unix://" in status.stdout
    assert "export CONTAINERS_CONF=" in status.stdout


@pytest.mark.parametrize("cli", ["docker", "podman"])
def test_both_clis_run_exec_copy_and_remove(cli: str, marker: str) -> None:
    require_engine()
    payload = bytes(range(256)) * 64  # binary-safe both ways

    async def main() -> str:
        async with create_runtime(DockerConfig(cli=cli, env={"FROM_CONFIG": "c"})) as rt:
            assert isinstance(rt, DockerRuntime)
            await rt.write("deep/dir/blob.bin", payload)
            size = await rt.run("wc -c < deep/dir/blob.bin")
            assert size.stdout.strip() == str(len(payload))
            assert await rt.read("/work/deep/dir/blob.bin") == payload
            env = await rt.run('echo "$FROM_CONFIG $GIVEN"', env={"GIVEN": marker})
            assert env.stdout.strip() == f"c {marker}"
            assert (await rt.run("exit 7")).exit_code == 7
            who = await rt.run("id -u; pwd")
            assert who.stdout.split() == ["0", "/work"]
            with pytest.raises(FileNotFoundError):
                await rt.read("missing.txt")
            with pytest.raises(FileNotFoundError, match="not a regular file"):
                await rt.read("deep")  # a directory holding a file is still no file
            return rt.name

    name = asyncio.run(main())
    assert not labelled_containers(**{f"{LABEL}.pid": str(os.getpid())}), f"{name} left"


@pytest.mark.parametrize("cli", ["docker", "podman"])
def test_root_inside_is_an_unprivileged_uid_on_the_host(cli: str, marker: str) -> None:
    """A container escape lands as nobody in particular: what root makes inside is owned, in
    the host-visible directory that holds it (the container's upper layer), by a uid of the
    engine's subordinate range, not by host root, and host root's files are nobody's inside."""
    require_engine()

    async def main() -> None:
        async with create_runtime(DockerConfig(cli=cli)) as rt:
            assert isinstance(rt, DockerRuntime) and rt.container is not None
            made = await rt.run(f"id -u; touch /root/made-{marker}; cat /proc/self/uid_map")
            assert made.exit_code == 0, made.stderr
            assert made.stdout.split()[:2] == ["0", "0"]  # root inside, mapped from...
            assert made.stdout.split()[2] != "0", made.stdout  # ...not host uid 0
            # sized by podman's client, never by probing the image (docs/runtimes.md)
            assert made.stdout.split()[3] == "65536", made.stdout
            inspect = [cli, "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", rt.container]
            upper = await asyncio.to_thread(
                subprocess.run, inspect, capture_output=True, text=True, timeout=60
            )
            host_file = Path(upper.stdout.strip()) / "root" / f"made-{marker}"
            owner = host_file.stat()
            assert owner.st_uid >= 100_000 and owner.st_gid >= 100_000, host_file
            assert owner.st_uid not in {entry.pw_uid for entry in pwd.getpwall()}

    asyncio.run(main())


@pytest.mark.parametrize("cli", ["docker", "podman"])
def test_proxy_credentials_of_the_host_do_not_reach_the_container(
    cli: str, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """podman's client copies the proxy variables of its environment into what it runs unless
    told not to; a proxy URL often carries credentials."""
    require_engine()
    for key in ("HTTPS_PROXY", "http_proxy", "ALL_PROXY", "FTP_PROXY"):
        monkeypatch.setenv(key, f"http://user:secret-{marker}@proxy.invalid:3128")

    async def main() -> str:
        async with create_runtime(DockerConfig(cli=cli)) as rt:
            return (await rt.run("cat /proc/1/environ | tr '\\0' '\\n'; env")).stdout

    seen = asyncio.run(main())
    assert "PATH=" in seen and f"secret-{marker}" not in seen


def test_eight_sandboxes_at_a_time_do_not_deadlock_the_engine(marker: str) -> None:
    """Unsized `auto` user namespaces deadlocked podman 4.3's whole engine when containers were
    created while others were mounted (started, copied to) or their podman processes shut
    down. A load check, not the guard: without the fix this passed once (the wedge is a race;
    the namespace size in the test above catches the old creation every time)."""
    require_engine()

    async def one(i: int) -> None:
        async with create_runtime(DockerConfig()) as rt:
            await rt.write("in.txt", f"{marker}-{i}")
            assert (await rt.run("cat in.txt")).stdout == f"{marker}-{i}"

    async def main() -> None:
        for _ in range(3):
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), timeout=180)

    asyncio.run(main())
    assert not labelled_containers(**{f"{LABEL}.pid": str(os.getpid())})


def test_podman_stop_does_not_wait_for_the_stop_timeout() -> None:
    require_engine()

    async def main() -> float:
        rt = create_runtime(DockerConfig(cli="podman"))
        await rt.start()
        began = time.perf_counter()
        await rt.stop()
        return time.perf_counter() - began

    # without `-t 0` podman sends SIGTERM and waits 10 s before SIGKILL
    assert asyncio.run(main()) < 8


def test_exec_sessions_do_not_pile_up_conmon_processes() -> None:
    """podman keeps two conmons per exec for `exit_command_delay` (300 s by default): the
    engine's config bounds them to the last seconds' execs; 60 execs leave none after ~10 s."""
    require_engine()
    if not os.environ.get("CONTAINERS_CONF"):
        pytest.skip("not the engine of scripts/container-engine.sh (no CONTAINERS_CONF)")

    def conmons(container: str) -> int:
        out = subprocess.run(["pgrep", "-f", f"conmon.* -c {container}"], capture_output=True)
        return len(out.stdout.split())

    async def main() -> tuple[int, int]:
        async with create_runtime(DockerConfig()) as rt:
            assert isinstance(rt, DockerRuntime) and rt.container
            for i in range(60):
                result = await rt.run(f"exit {i % 5}")
                assert result.exit_code == i % 5  # the exit code survives the short delay
            peak = conmons(rt.container)
            deadline = time.monotonic() + 30
            while conmons(rt.container) > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            return peak, conmons(rt.container)

    peak, settled = asyncio.run(main())
    assert settled <= 1, f"{settled} conmon processes still alive (peak {peak})"
