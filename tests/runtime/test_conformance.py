"""One conformance suite over every runtime this machine has: the promises a runtime makes to
the rollouts (and to the host) tested the same way for each. A runtime that does not make a
promise skips that test with the reason, never silently.

| promise                             | subprocess         | bwrap | docker | ray-bwrap | modal   |
| files, cwd, env, exit, timeout, cap | yes                | yes   | yes    | yes       | yes     |
| background gone after stop()        | yes                | yes   | yes    | yes       | yes     |
| kill_commands: all gone, box stays  | yes (marker)       | yes   | yes    | yes       | no      |
| network off by default              | no (host network)  | yes   | yes    | yes       | yes     |
| network when asked reaches the host | yes (always)       | yes   | bridge | yes       | yes     |
| process limit                       | no (root exempt)   | yes   | yes    | no (skip) | no      |
| memory limit per process            | yes (RLIMIT_AS)    | yes   | yes    | no (skip) | yes     |
| memory limit of the whole sandbox   | no                 | yes   | yes    | no (skip) | yes     |
| CPU seconds / CPU rate              | seconds            | secs  | rate   | no (skip) | no      |
| host secrets and files invisible    | env only           | yes   | yes    | no (skip) | yes     |
| nothing left after SIGKILL of us    | no (no supervisor) | yes   | yes    | no (skip) | cleanup |

prime runs against `metrale sandbox-sim prime` (bwrap behind it) through the official SDK and
makes the promises of the first five rows (network off unless asked: `network_allowlist=[]`),
the memory limit per process (its `memory_mb`) and host secrets and files invisible. Not the
others: the service bounds cores and memory, not processes or CPU seconds (no `BOUNDS`
declared); and a remote sandbox outlives a SIGKILLed run until `metrale cleanup --runtime
prime` (tests/runtime/test_prime.py).

modal runs against `metrale sandbox-sim modal` (bwrap behind it) through the official SDK and
makes the same promises, with the service's network off and without kill_commands (the service
has no such call); its SIGKILL case runs `metrale cleanup --runtime modal` and then finds
nothing left.

Each test checks (the `marker` fixture) that no process of it is left on the host.

Any installed runtime can be put through it: `METRALE_CONFORMANCE_RUNTIMES=NAME[,NAME]` adds
it to the cases (tests/runtime/test_runtime_plugin.py does so for a runtime of another
package). A promise beyond the basic ones is tested where the runtime declares the capability
that makes it (`Capability`): a runtime is held to what it says of itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metrale.runtime import Runtime, create_runtime, runtime_config
from metrale.runtime.base import Capability
from metrale.runtime.registry import config_class
from tests.runtime.conftest import HAVE_BWRAP, processes_with, wait_gone
from tests.runtime.engine import labelled_containers, require_engine

BUILT_IN = ["subprocess", "bwrap", "docker", "ray-bwrap", "prime", "modal"]
EXTRA = [n for n in os.environ.get("METRALE_CONFORMANCE_RUNTIMES", "").split(",") if n.strip()]
RUNTIMES = [*BUILT_IN, *(n.strip() for n in EXTRA)] if EXTRA else BUILT_IN


def skip_unless(name: str, makes: bool, reason: str) -> None:
    if not makes:
        pytest.skip(f"{name}: {reason}")


def declares(name: str, capability: Capability) -> bool:
    """Whether runtime `name` says it makes the promise `capability` stands for."""
    if name == "ray-bwrap":
        return not runtime_config("ray", inner="bwrap").lacks(frozenset({capability}))
    return capability in config_class(name).capabilities


def takes(name: str, option: str) -> bool:
    """Whether runtime `name` has the flat option (`memory_mb`, `cpu_s`, ...)."""
    return option in config_class("bwrap" if name == "ray-bwrap" else name).flat_keys()


@pytest.fixture(scope="module")
def prime_service() -> Iterator[None]:
    """`metrale sandbox-sim prime` (bwrap behind it), this process's SDK pointed at it; one
    sandbox made and deleted first, so the emulator's own shared files exist before any test
    counts the host's directories."""
    from tests.runtime.prime_emulator import client_env, prime_emulator

    with prime_emulator() as emulator, client_env(emulator):

        async def warm() -> None:
            async with create_runtime(runtime_config("prime")) as rt:
                await rt.run("true")

        asyncio.run(warm())
        yield
        assert emulator.left() == [], "a sandbox outlived its test"


@pytest.fixture(params=RUNTIMES)
def name(request: pytest.FixtureRequest) -> str:
    runtime = request.param
    if runtime in ("bwrap", "ray-bwrap", "prime", "modal") and not HAVE_BWRAP:
        pytest.skip("bwrap not installed")
    if runtime == "prime":
        pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")
        request.getfixturevalue("prime_service")
    if runtime == "modal":
        pytest.importorskip("modal", reason="the modal extra is not installed")
        request.getfixturevalue("modal_sim")
    if runtime == "docker":
        require_engine()
    return runtime


@pytest.fixture
def make(name: str, request: pytest.FixtureRequest) -> Callable[..., Runtime]:
    """`make(**options)`: a runtime of this case's kind with flat runtime options."""

    def build(**options: Any) -> Runtime:
        if name == "ray-bwrap":
            address = request.getfixturevalue("ray_cluster")
            return create_runtime(runtime_config("ray", address=address, inner="bwrap", **options))
        return create_runtime(runtime_config(name, **options))

    return build


def inside(make: Callable[..., Runtime], body: Callable[[Runtime], Awaitable[Any]],
           **options: Any) -> Any:  # fmt: skip
    async def main() -> Any:
        async with make(**options) as rt:
            return await body(rt)

    return asyncio.run(main())


# ------------------------------------------------------------------ what every runtime does


def test_files_round_trip_and_cwd(make: Callable[..., Runtime], marker: str) -> None:
    async def body(rt: Runtime) -> None:
        await rt.write("sub/in.txt", f"hello {marker}")
        result = await rt.run("cat in.txt && echo made > out.txt && pwd", cwd="sub")
        assert result.stdout.startswith(f"hello {marker}")
        assert result.stdout.rstrip().endswith("/sub")
        assert await rt.read("sub/out.txt") == b"made\n"
        blob = bytes(range(256)) * 16
        await rt.write("blob.bin", blob)
        assert await rt.read("blob.bin") == blob
        argv = await rt.run(["sh", "-c", 'printf "%s|" "$@"', "sh", "a b", "c'd"])
        assert argv.stdout == "a b|c'd|"

    inside(make, body)


def test_env_exit_codes_and_stderr(make: Callable[..., Runtime], marker: str) -> None:
    async def body(rt: Runtime) -> None:
        given = await rt.run('echo "$FROM_CONFIG/$GIVEN"', env={"GIVEN": marker})
        assert given.stdout.strip() == f"cfg/{marker}"
        failed = await rt.run("echo oops >&2; exit 42")
        assert (failed.exit_code, failed.stderr.strip(), failed.timed_out) == (42, "oops", False)
        missing = await rt.run(["no-such-command-metrale"])
        assert missing.exit_code != 0

    inside(make, body, env={"FROM_CONFIG": "cfg"})


def test_timeout_kills_the_command(make: Callable[..., Runtime], marker: str) -> None:
    async def body(rt: Runtime) -> None:
        started = time.perf_counter()
        result = await rt.run(f"sleep {marker}; echo never", timeout=1)
        assert result.timed_out and result.exit_code == 124
        assert "never" not in result.stdout
        assert time.perf_counter() - started < 15
        assert not wait_gone(marker, 5), "the timed-out command survived its timeout"

    inside(make, body)


def test_output_is_capped_head_and_tail(make: Callable[..., Runtime], marker: str) -> None:
    cap = 64 * 1024

    async def body(rt: Runtime) -> None:
        result = await rt.run(
            f"echo HEAD-{marker}; head -c 64M /dev/zero; echo; echo TAIL-{marker}", timeout=120
        )
        assert result.exit_code == 0
        assert result.stdout.startswith(f"HEAD-{marker}")
        assert result.stdout.rstrip().endswith(f"TAIL-{marker}")
        assert len(result.stdout.encode()) < cap + 100
        total = len(f"HEAD-{marker}\n") + (64 << 20) + 1 + len(f"TAIL-{marker}\n")
        assert result.stdout_dropped == total - cap

    inside(make, body, output_cap_bytes=cap)


def test_background_processes_are_gone_after_stop(
    make: Callable[..., Runtime], marker: str
) -> None:
    async def body(rt: Runtime) -> None:
        result = await rt.run(
            f"sleep {marker} & setsid sleep {marker} > /dev/null 2>&1 & "
            f"(setsid sh -c 'sleep {marker}' &) ; echo started"
        )
        assert result.stdout.strip() == "started"
        assert result.duration_s < 10, "run() waited for background children"
        deadline = time.monotonic() + 10
        while len(processes_with(marker)) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(processes_with(marker)) >= 3
        await rt.stop()
        assert not wait_gone(marker, 10)
        await rt.stop()  # idempotent

    inside(make, body)


def test_kill_commands_ends_every_process_and_keeps_the_sandbox(
    name: str, make: Callable[..., Runtime], marker: str
) -> None:
    """What scoring relies on: a daemon left by one phase does not run into the next."""
    skip_unless(name, declares(name, Capability.KILL_COMMANDS), "declares no kill_commands")

    async def body(rt: Runtime) -> None:
        await rt.run(
            f"sleep {marker} & setsid sleep {marker} > /dev/null 2>&1 & "
            f"(setsid sh -c 'sleep {marker}' &) ; echo started"
        )
        # where the sandbox allows it, one more in a PID namespace of its own (bwrap: the
        # namespace's processes are found through their parent namespace)
        await rt.run(
            f"(setsid unshare --user --map-root-user --pid --fork sleep {marker} "
            "> /dev/null 2>&1 &)"
        )
        deadline = time.monotonic() + 10
        while len(processes_with(marker)) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(processes_with(marker)) >= 3
        await rt.kill_commands()
        assert not wait_gone(marker, 5), "a command's process survived kill_commands"
        await rt.write("after.txt", "still here")
        after = await rt.run("cat after.txt")
        assert after.stdout == "still here"

    inside(make, body)


def _host_dirs() -> set[str]:
    """The host directories runtimes make for their sandboxes (workdirs, bwrap's /etc copy)."""
    roots = (Path(tempfile.gettempdir()), Path("/dev/shm"))  # bwrap's control dirs: /dev/shm
    prefixes = ("metrale-sbx-", "metrale-bwrap-")
    return {p.name for tmp in roots for prefix in prefixes for p in tmp.glob(f"{prefix}*")}


def _another_runs(name: str) -> bool:
    """Whether `name` is a bwrap directory of a live process that is neither this one nor
    started by it (another test worker's, under `-n`): not this test's to judge."""
    owner = name.removeprefix("metrale-bwrap-").split("-", 1)[0]
    if not owner.isdigit() or owner == name:
        return False
    pid = int(owner)
    while pid > 1:
        if pid == os.getpid():
            return False
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return pid != int(owner)  # gone: a live owner had us or init as its root
    return True


def test_a_stopped_sandbox_leaves_no_directory_on_the_host(
    name: str, make: Callable[..., Runtime], request: pytest.FixtureRequest
) -> None:
    """What a sandbox made on the host goes with its stop; only this process's own /etc copy
    (bwrap's, one per process, removed at its exit) outlives it (and the modal emulator's, a
    process of its own). A Ray actor's process is killed after the stop, so nothing of it may
    wait for an exit."""
    before = _host_dirs()
    emulator = request.getfixturevalue("modal_sim").proc.pid if name == "modal" else None

    async def body(rt: Runtime) -> None:
        assert (await rt.run("echo hi > here.txt && cat here.txt")).stdout == "hi\n"

    inside(make, body)
    own = tuple(f"metrale-bwrap-{pid}-etc-" for pid in (os.getpid(), emulator) if pid)
    deadline = time.monotonic() + 10  # bounded: a killed actor's files would never go
    while True:
        left = sorted(
            d for d in _host_dirs() - before if not d.startswith(own) and not _another_runs(d)
        )
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert left == []


# ------------------------------------------------------------------ isolation and limits


def _host_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


PROBE = textwrap.dedent("""\
    import socket, sys
    for host in sys.argv[2:]:
        try:
            socket.create_connection((host, int(sys.argv[1])), timeout=3).close()
            print("reached", host)
        except OSError as exc:
            print("refused", host, exc)
    """)


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP server on every host address: what a sandbox with network would reach."""
    server = socket.create_server(("0.0.0.0", 0))
    server.listen(16)
    hosts = ["127.0.0.1"] + ([ip] if (ip := _host_ip()) else [])
    yield server.getsockname()[1], hosts
    server.close()


def test_the_network_probe_reaches_the_host_from_the_host(
    listener: tuple[int, list[str]],
) -> None:
    """The control of the next test: the same probe, unsandboxed, reaches every address."""
    port, hosts = listener
    out = subprocess.run([sys.executable, "-c", PROBE, str(port), *hosts],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert sum(line.startswith("reached ") for line in out.stdout.splitlines()) == len(hosts)


def test_network_is_off_by_default(
    name: str, make: Callable[..., Runtime], listener: tuple[int, list[str]], marker: str
) -> None:
    skip_unless(name, declares(name, Capability.NETWORK_OFF), "runs on the host network")
    port, hosts = listener

    async def body(rt: Runtime) -> None:
        await rt.write("probe.py", PROBE)
        result = await rt.run(["python3", "probe.py", str(port), *hosts], timeout=60)
        assert result.exit_code == 0, result.stderr
        assert "reached" not in result.stdout, result.stdout
        lines = result.stdout.splitlines()
        assert sum(line.startswith("refused ") for line in lines) == len(hosts), lines

    inside(make, body)


def test_network_when_asked_reaches_the_host(
    name: str, make: Callable[..., Runtime], listener: tuple[int, list[str]], marker: str
) -> None:
    """The other half of `network`: a sandbox given a network (its runtime's `network`
    option; subprocess always has the host's) reaches a host address. Behind the emulators,
    the network the SDK's creation asked for (not one they give every sandbox)."""
    skip_unless(name, declares(name, Capability.NETWORK), "gives no network beyond loopback")
    options: dict[str, Any] = {}
    if takes(name, "network"):
        options["network"] = "bridge" if name == "docker" else True
    port, hosts = listener

    async def body(rt: Runtime) -> None:
        await rt.write("probe.py", PROBE)
        result = await rt.run(["python3", "probe.py", str(port), *hosts], timeout=60)
        assert result.exit_code == 0, result.stderr
        # a bridge reaches the host's own address, not its loopback (the sandbox's own)
        assert "reached" in result.stdout, result.stdout

    inside(make, body, **options)


#: Forks sleeping children until a fork fails; prints how many started (no fork needed to
#: count them, unlike `ls /proc | wc -l` once the limit is reached).
FORKS = textwrap.dedent("""\
    import os, time
    started = 0
    for _ in range(80):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
    print(started, flush=True)
    """)


def test_process_limit_holds(name: str, make: Callable[..., Runtime], marker: str) -> None:
    skip_unless(name, declares(name, Capability.BOUNDS),
                "RLIMIT_NPROC binds no root process and counts the host user's"
                if name == "subprocess" else "declares no process bound")  # fmt: skip

    async def body(rt: Runtime) -> None:
        await rt.write("forks.py", FORKS)
        result = await rt.run(["python3", "forks.py", marker], timeout=60)
        started = int(result.stdout.split()[-1])
        assert 1 <= started < 32, f"{started} processes forked under a limit of 32"

    inside(make, body, max_procs=32)


MEMORY_HOG = (
    "python3 -c \"b = b'x' * ({mb} << 20); print('held', flush=True); "
    'import time; time.sleep({s})"'
)


def test_memory_limit_per_process(name: str, make: Callable[..., Runtime], marker: str) -> None:
    skip_unless(name, takes(name, "memory_mb"), "has no memory limit")

    async def body(rt: Runtime) -> None:
        result = await rt.run(MEMORY_HOG.format(mb=400, s=0), timeout=60)
        assert "held" not in result.stdout and result.exit_code != 0

    inside(make, body, memory_mb=256)


def test_memory_limit_of_the_whole_sandbox(
    name: str, make: Callable[..., Runtime], marker: str
) -> None:
    skip_unless(name, declares(name, Capability.BOUNDS), "per-process limits only")

    async def body(rt: Runtime) -> None:
        hogs = " ".join(f"{MEMORY_HOG.format(mb=100, s=3)} &" for _ in range(6))
        result = await rt.run(f"{hogs} wait", timeout=90)
        assert result.stdout.count("held") < 6, "6 x 100 MB held under a 256 MB limit"

    inside(make, body, memory_mb=256)


def test_cpu_seconds_limit_kills(name: str, make: Callable[..., Runtime], marker: str) -> None:
    skip_unless(name, name != "docker", "docker limits the CPU rate (--cpus), not CPU seconds")
    skip_unless(name, takes(name, "cpu_s"), "has no CPU seconds limit")

    async def body(rt: Runtime) -> None:
        result = await rt.run(f"echo {marker} >/dev/null; while :; do :; done", timeout=30)
        assert not result.timed_out and result.exit_code != 0  # SIGXCPU / SIGKILL at 1 s

    inside(make, body, cpu_s=1)


def test_cpu_rate_limit_holds(name: str, make: Callable[..., Runtime], marker: str) -> None:
    skip_unless(name, name not in ("prime", "modal"),
                "the emulator's sandboxes do not bound the CPU rate")  # fmt: skip
    skip_unless(name, name == "docker", "no CPU rate limit (RLIMIT_CPU seconds only)")

    async def body(rt: Runtime) -> None:
        # two busy loops for 3 s of wall clock may use up to 6 CPU seconds on 2 idle cores;
        # at --cpus 0.25 they get ~0.75 s. `times`: the children's user and system seconds.
        loop = "timeout 3 sh -c 'while :; do :; done'"
        result = await rt.run(f"({loop} & {loop} & wait); times", timeout=60)
        child = result.stdout.strip().splitlines()[-1].split()
        used = sum(float(t.rstrip("s").split("m")[0]) * 60 + float(t.rstrip("s").split("m")[1])
                   for t in child)  # fmt: skip
        assert used < 1.5, f"{used:.2f} CPU seconds in 3 s at --cpus 0.25"

    inside(make, body, cpus=0.25)


def test_host_secrets_are_invisible(
    name: str, make: Callable[..., Runtime], marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("OPENAI_API_KEY", "DATABASE_URL", "GH_PAT", "AWS_ACCESS_KEY_ID",
                "SSH_AUTH_SOCK", "METRALE_DB_PASSWORD"):  # fmt: skip
        monkeypatch.setenv(key, f"secret-{marker}")

    async def body(rt: Runtime) -> None:
        result = await rt.run("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
        assert f"secret-{marker}" not in result.stdout

    inside(make, body)


def test_host_files_are_invisible(
    name: str, make: Callable[..., Runtime], marker: str, tmp_path: Path
) -> None:
    skip_unless(name, declares(name, Capability.TASK_IMAGE) or declares(name, Capability.REMOTE),
                "runs on the host filesystem")  # fmt: skip
    secret = tmp_path / "host-secret.txt"
    secret.write_text(f"secret-{marker}")
    home = Path.home() / ".ssh"
    readable = os.access("/etc/shadow", os.R_OK)
    shadow = Path("/etc/shadow").read_text().splitlines()[:1] if readable else []

    async def body(rt: Runtime) -> None:
        result = await rt.run(f"cat {secret}; ls -a {home} 2>&1; cat /etc/shadow 2>&1 | head -1")
        assert f"secret-{marker}" not in result.stdout
        if shadow and shadow[0]:
            assert shadow[0] not in result.stdout, "the host's /etc/shadow is readable"
        if home.is_dir():
            for entry in os.listdir(home):
                assert entry not in result.stdout.split(), f"~/.ssh/{entry} is visible"

    inside(make, body)


KILLED_RUN = textwrap.dedent("""\
    import asyncio, sys
    from metrale.runtime import create_runtime, runtime_config

    async def main():
        rt = create_runtime(runtime_config(sys.argv[1]))
        await rt.start()
        await rt.run("sleep " + sys.argv[2] + " > /dev/null 2>&1 &")
        print("ready", getattr(rt, "workdir", None) or "", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """)


def test_nothing_is_left_after_a_sigkill_of_metrale(name: str, marker: str) -> None:
    why = {
        "ray-bwrap": "Ray kills a dead driver's actors itself",
        "prime": "a remote sandbox outlives a killed run until `metrale cleanup --runtime prime` "
        "(tests/runtime/test_prime.py)",
    }.get(name, "no supervisor outside metrale: a SIGKILLed run leaves its commands")
    skip_unless(name, name in ("bwrap", "docker", "modal") and declares(name, Capability.LEFTOVERS),
                why)  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, name, marker],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], proc.stderr.read() if proc.stderr else line
        workdir = Path(line[1]) if len(line) > 1 else None
        assert processes_with(marker)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        if name == "modal":  # the service keeps it: `metrale cleanup` finds a dead run's
            cleaned = subprocess.run(
                [sys.executable, "-m", "metrale", "cleanup", "--runtime", "modal"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert cleaned.returncode == 0, cleaned.stderr
            assert "removed modal sandbox" in cleaned.stdout, cleaned.stdout
        assert not wait_gone(marker, 30), "the sandbox's process outlived metrale"
        if name == "docker":
            deadline = time.monotonic() + 30
            while labelled_containers(**{"metrale.sandbox.pid": str(proc.pid)}):
                assert time.monotonic() < deadline, "the container outlived metrale"
                time.sleep(0.5)
        # bwrap's watchdog removes the workdir and cgroups; `metrale cleanup` would find any
        # it could not (and must say nothing is wrong either way)
        deadline = time.monotonic() + 15
        while workdir is not None and workdir.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        cleaned = subprocess.run([sys.executable, "-m", "metrale", "cleanup"],
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
        assert cleaned.returncode == 0, cleaned.stderr
        if workdir is not None:
            assert not workdir.exists(), cleaned.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
