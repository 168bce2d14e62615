"""The warm step: build the task's Rust dependencies once per machine, for every sandbox to reuse.

The warm project (`warm/`: Cargo.toml, Cargo.lock, a ping/pong server with a test) is fetched
from crates.io and built (`cargo build` and `cargo test --no-run`) on the host, since it is
metrale's own code, into `<cache>/cargo/<key>/`:

- `home/`: the CARGO_HOME (registry index, downloaded crates, unpacked sources). Each sandbox
  gets it read-only *at the same path*: cargo's fingerprints hold the path of every source, so a
  registry at another path would rebuild every dependency.
- `target/`: the target dir. Each sandbox gets its own copy (cargo writes into it), so the
  agent's and the scorer's builds compile only the agent's crate.

`<key>` is the first 16 hex digits of sha256 over the warm project's files and `rustc -vV`, so a
new lockfile or toolchain warms a fresh cache; `<cache>` is `$METRALE_CACHE_DIR`, else
`$XDG_CACHE_HOME/metrale`, else `~/.cache/metrale`. A `ready` file is written last; a file lock
makes concurrent warms of one key wait for each other. In the sandboxes cargo runs with
`CARGO_NET_OFFLINE=true`: a crate or version the cache lacks is a fast build error ("no matching
package named ... found"), never a hang on a network that is not there.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from metrale.errors import RunError, UsageError

WARM_FILES = ("Cargo.toml", "Cargo.lock", "src/main.rs")
CARGO_HINT = (
    "the agentic_webserver benchmark needs Rust's cargo on this machine: install it with rustup "
    "(https://rustup.rs) or put cargo on PATH"
)


@dataclass(frozen=True)
class Toolchain:
    """The real cargo/rustc directory (not rustup's proxy), so sandboxes need no rustup state."""

    bin_dir: Path
    rustc_version: str

    @property
    def root(self) -> Path:
        return self.bin_dir.parent


@dataclass(frozen=True)
class WarmCache:
    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def ready(self) -> bool:
        return (self.root / "ready").is_file()


def find_toolchain() -> Toolchain:
    """Locate cargo and its toolchain; `UsageError` with an install hint when there is none."""
    cargo = shutil.which("cargo") or shutil.which("cargo", path=str(Path.home() / ".cargo/bin"))
    if cargo is None:
        raise UsageError(CARGO_HINT)
    bin_dir = Path(cargo).resolve().parent
    rustup = shutil.which("rustup", path=f"{Path(cargo).parent}:{os.environ.get('PATH', '')}")
    if rustup is not None:  # cargo is rustup's proxy: find the toolchain it stands for
        found = _run([rustup, "which", "cargo"], timeout=60)
        if found.returncode == 0 and found.stdout.strip():
            bin_dir = Path(found.stdout.strip()).resolve().parent
    rustc = bin_dir / "rustc"
    if not (bin_dir / "cargo").is_file() or not rustc.is_file():
        raise UsageError(f"{CARGO_HINT} (found {cargo}, but no cargo and rustc in {bin_dir})")
    version = _run([str(rustc), "-vV"], timeout=60)
    if version.returncode != 0:
        raise UsageError(f"{CARGO_HINT} ({rustc} -vV failed: {version.stderr.strip()[:200]})")
    return Toolchain(bin_dir=bin_dir, rustc_version=version.stdout)


def cache_dir() -> Path:
    explicit = os.environ.get("METRALE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "metrale"


def warm_key(toolchain: Toolchain) -> str:
    digest = hashlib.sha256(toolchain.rustc_version.encode())
    project = resources.files(__package__).joinpath("warm")
    for name in WARM_FILES:
        digest.update(name.encode() + b"\0" + project.joinpath(name).read_bytes())
    return digest.hexdigest()[:16]


def warm_cache(toolchain: Toolchain) -> WarmCache:
    return WarmCache(cache_dir() / "cargo" / warm_key(toolchain))


async def warm(toolchain: Toolchain, timeout_s: float = 1800.0) -> tuple[WarmCache, float, bool]:
    """Make sure the cache for this toolchain is built: (cache, seconds taken, built now?)."""
    cache = warm_cache(toolchain)
    started = time.perf_counter()
    if cache.ready:
        return cache, time.perf_counter() - started, False
    built = await asyncio.to_thread(_warm_locked, toolchain, cache, timeout_s)
    return cache, time.perf_counter() - started, built


def _warm_locked(toolchain: Toolchain, cache: WarmCache, timeout_s: float) -> bool:
    cache.root.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.root.parent / f"{cache.root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cache.ready:  # another process warmed it while we waited
            return False
        shutil.rmtree(cache.root, ignore_errors=True)
        project = cache.root / "project"
        (project / "src").mkdir(parents=True)
        source = resources.files(__package__).joinpath("warm")
        for name in WARM_FILES:
            (project / name).write_bytes(source.joinpath(name).read_bytes())
        env = {
            **os.environ,
            "PATH": f"{toolchain.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "CARGO_HOME": str(cache.home),
            "CARGO_TARGET_DIR": str(cache.target),
            "CARGO_TERM_COLOR": "never",
        }
        deadline = time.monotonic() + timeout_s
        for step in (["fetch"], ["build"], ["test", "--no-run"]):
            left = deadline - time.monotonic()
            try:
                done = _run(
                    [str(toolchain.bin_dir / "cargo"), *step, "--locked"],
                    timeout=max(1.0, left), cwd=project, env=env,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                raise RunError(
                    f"warm step: cargo {' '.join(step)} did not finish within {timeout_s:g} s"
                ) from None
            if done.returncode != 0:
                tail = " | ".join(done.stderr.strip().splitlines()[-3:])
                raise RunError(f"warm step: cargo {' '.join(step)} failed: {tail[:400]}")
        (cache.root / "ready").write_text(toolchain.rustc_version)
        return True


def _run(
    argv: list[str], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def prepare_sandbox(cache: WarmCache, sandbox: Path) -> None:
    """Wipe `sandbox` and lay it out: `work/` (the agent's cwd) with `target -> ../target`, and
    `target/`, a copy of the warm target dir. Blocking; call it in a thread."""
    if sandbox.exists():
        _make_writable(sandbox)
        shutil.rmtree(sandbox)
    (sandbox / "work").mkdir(parents=True)
    subprocess.run(
        ["cp", "-a", "--reflink=auto", str(cache.target), str(sandbox / "target")], check=True
    )
    (sandbox / "work" / "target").symlink_to("../target")


def _make_writable(path: Path) -> None:
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            p = Path(root) / d
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | 0o700)
